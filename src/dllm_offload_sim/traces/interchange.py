"""The routing interchange format: a plain, versioned file any engine's routing log can be written to, and
``dllm-trace-import``, which turns it into a trace.

A JSON Lines file. Its first line is the header::

    {"format": "dllm-routing", "version": 1, "model": "qwen3-30b-a3b", "decoding": "autoregressive",
     "block_length": 1, "dataset": "my-prompts", "engine": "vllm"}

``model`` is a catalogue model or a model file (docs/models.md); ``decoding`` is ``autoregressive`` or
``block-diffusion``; ``dataset`` and ``engine`` are free text. Every further line is one routed token row of one
MoE layer of one forward::

    {"request": 0, "forward": 3, "layer": 5, "token": 0, "experts": [17, 3, ...], "weights": [0.31, 0.12, ...]}

``layer`` is the model's layer id (one of its MoE layers), ``token`` the row within the forward (0, 1, ...),
``experts`` the top-k ids in gate order and ``weights`` their combine weights (absent on every row: each is
``1 / top_k``, and the trace records that). Optional on any row: ``confidence`` (the token's max output
probability at this forward). Optional forward fields, the same on every row of a forward: ``phase`` (``prefill``,
``denoise`` or ``commit``), ``kv_len`` (positions attended besides the forward's own rows), ``n_decoded``
(tokens this forward produced), ``block`` and ``step_in_block``, and per row ``was_masked`` and ``decoded``.
Autoregressive logs may leave them out: forward 0 is the prompt's prefill, every later forward decodes its one
token, ``kv_len`` counts the tokens of the forwards before. Block-diffusion logs must give ``phase``, ``kv_len``,
``n_decoded``, ``block`` and ``step_in_block``.

Every problem is a :class:`TraceError` naming the file, the line and the field.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dllm_offload_sim.traces.catalogue import find_model
from dllm_offload_sim.traces.cli import HelpFormatter, entry_point
from dllm_offload_sim.traces.errors import TraceError
from dllm_offload_sim.traces.schema import PHASES, PREFILL, RequestArrays
from dllm_offload_sim.traces.topology import ModelTopology

FORMAT = "dllm-routing"
VERSION = 1
DECODINGS = ("autoregressive", "block-diffusion")
FORWARD_FIELDS = ("phase", "kv_len", "n_decoded", "block", "step_in_block")
ROW_FIELDS = {
    "request",
    "forward",
    "layer",
    "token",
    "experts",
    "weights",
    "confidence",
    "was_masked",
    "decoded",
}


@dataclass(frozen=True)
class InterchangeHeader:
    """The first line of an interchange file: the model, how it decoded, and where the log comes from."""

    model: str
    decoding: str
    block_length: int
    dataset: str = ""
    engine: str = ""

    def line(self) -> str:
        return json.dumps({"format": FORMAT, "version": VERSION, **self.__dict__})


class InterchangeWriter:
    """Writes an interchange file: the header, then one :meth:`row` per routed token row. Used as a context
    manager; the file appears only when the block ends without an error."""

    def __init__(self, path, header: InterchangeHeader):
        self.path, self.header = Path(path), header
        self._tmp = self.path.with_name(self.path.name + ".partial")

    def __enter__(self) -> InterchangeWriter:
        self._fh = open(self._tmp, "w", encoding="utf-8")
        self._fh.write(self.header.line() + "\n")
        return self

    def row(
        self, request: int, forward: int, layer: int, token: int, experts, weights=None, **fields
    ) -> None:
        rec = {"request": int(request), "forward": int(forward), "layer": int(layer), "token": int(token)}
        rec["experts"] = [int(e) for e in experts]
        if weights is not None:
            rec["weights"] = [float(w) for w in weights]
        rec.update(fields)
        self._fh.write(json.dumps(rec) + "\n")

    def __exit__(self, exc_type, exc, tb) -> None:
        self._fh.close()
        if exc_type is None:
            self._tmp.replace(self.path)
        else:
            self._tmp.unlink(missing_ok=True)


def _header(path: Path, line: str) -> InterchangeHeader:
    where = f"{path}, line 1"
    try:
        h = json.loads(line)
    except ValueError:
        raise TraceError(f"{where}: not a JSON header line") from None
    if not isinstance(h, dict) or h.get("format") != FORMAT:
        raise TraceError(f"{where}: the header must hold \"format\": \"{FORMAT}\"; got {str(h)[:80]}")
    if h.get("version") != VERSION:
        raise TraceError(
            f"{where}, field 'version': {h.get('version')!r}; this reader reads version {VERSION}"
        )
    for f in ("model", "decoding", "block_length"):
        if f not in h:
            raise TraceError(f"{where}: missing field {f!r}")
    if h["decoding"] not in DECODINGS:
        raise TraceError(f"{where}, field 'decoding': {h['decoding']!r}; one of {', '.join(DECODINGS)}")
    bl = h["block_length"]
    if isinstance(bl, bool) or not isinstance(bl, int) or bl < 1:
        raise TraceError(f"{where}, field 'block_length': {bl!r} must be an integer >= 1")
    return InterchangeHeader(
        str(h["model"]), h["decoding"], bl, str(h.get("dataset", "")), str(h.get("engine", ""))
    )


def read_interchange(path) -> tuple[InterchangeHeader, ModelTopology, list[RequestArrays], bool]:
    """The header, the model's topology, every request as arrays, and whether the log gave weights."""
    path = Path(path)
    try:
        fh = open(path, encoding="utf-8")
    except OSError as e:
        raise TraceError(f"{path}: cannot read it ({e.strerror or e})") from None
    with fh:
        first = fh.readline()
        if not first:
            raise TraceError(f"{path}: empty file; the first line is the header (docs/traces.md)")
        header = _header(path, first)
        topo = find_model(header.model).topology
        layer_index = {lid: j for j, lid in enumerate(topo.moe_layers)}
        rows: dict = defaultdict(dict)  # request -> forward -> {(layer, token): (line, record)}
        have_weights = None
        for n, line in enumerate(fh, start=2):
            if not line.strip():
                continue
            where = f"{path}, line {n}"
            try:
                r = json.loads(line)
            except ValueError:
                raise TraceError(f"{where}: not a JSON object") from None
            unknown = sorted(set(r) - ROW_FIELDS - set(FORWARD_FIELDS)) if isinstance(r, dict) else []
            if not isinstance(r, dict) or unknown:
                raise TraceError(
                    f"{where}: unknown field {unknown[0]!r}" if unknown else f"{where}: not a JSON object"
                )
            for f in ("request", "forward", "layer", "token", "experts"):
                if f not in r:
                    raise TraceError(f"{where}: missing field {f!r}")
                if f != "experts" and (isinstance(r[f], bool) or not isinstance(r[f], int) or r[f] < 0):
                    raise TraceError(f"{where}, field {f!r}: {r[f]!r} must be an integer >= 0")
            if r["layer"] not in layer_index:
                raise TraceError(
                    f"{where}, field 'layer': {r['layer']} is not a MoE layer of {topo.name} "
                    f"(its MoE layers: {topo.moe_layers[0]}..{topo.moe_layers[-1]})"
                )
            ex = r["experts"]
            if not isinstance(ex, list) or len(ex) != topo.top_k:
                raise TraceError(f"{where}, field 'experts': expected {topo.top_k} ids (top-k), got {ex!r}")
            if any(isinstance(e, bool) or not isinstance(e, int) or not 0 <= e < topo.n_experts for e in ex):
                raise TraceError(
                    f"{where}, field 'experts': ids must be integers in 0..{topo.n_experts - 1}: {ex}"
                )
            if len(set(ex)) != len(ex):
                raise TraceError(f"{where}, field 'experts': an expert appears twice: {ex}")
            if ("weights" in r) != bool(have_weights) and have_weights is not None:
                raise TraceError(f"{where}, field 'weights': give weights on every row or on none")
            have_weights = "weights" in r
            if have_weights:
                w = r["weights"]
                if (
                    not isinstance(w, list)
                    or len(w) != topo.top_k
                    or not all(isinstance(x, (int, float)) and np.isfinite(x) and x >= 0 for x in w)
                ):
                    raise TraceError(
                        f"{where}, field 'weights': {topo.top_k} finite numbers >= 0 expected: {w!r}"
                    )
            key = (r["layer"], r["token"])
            fwd = rows[r["request"]].setdefault(r["forward"], {})
            if key in fwd:
                raise TraceError(
                    f"{where}: request {r['request']}, forward {r['forward']}, layer {r['layer']}, token "
                    f"{r['token']} appears twice (first on line {fwd[key][0]})"
                )
            fwd[key] = (n, r)
    if not rows:
        raise TraceError(f"{path}: no routing rows after the header")
    reqs = [_request(path, header, topo, layer_index, rid, rows[rid]) for rid in sorted(rows)]
    return header, topo, reqs, bool(have_weights)


def _request(path, header, topo, layer_index, rid, forwards) -> RequestArrays:
    L, k = topo.n_moe_layers, topo.top_k
    order = sorted(forwards)
    if order != list(range(len(order))):
        gap = next(i for i, f in enumerate(order) if f != i)
        raise TraceError(
            f"{path}: request {rid} has no forward {gap} (forwards are numbered 0, 1, ... per request)"
        )
    S = len(order)
    phase = np.zeros(S, np.int8)
    block, sib, kv, dec = (np.zeros(S, np.int32) for _ in range(4))
    offsets = [0]
    ids_all, w_all, conf, masked, decoded = [], [], [], [], []
    seen = 0
    for s in order:
        cells = forwards[s]
        tokens = sorted({t for _, t in cells})
        if tokens != list(range(len(tokens))):
            raise TraceError(
                f"{path}: request {rid}, forward {s}: token rows must be 0..n-1, got {tokens[:8]}"
            )
        T = len(tokens)
        missing = [(lid, t) for lid in topo.moe_layers for t in range(T) if (lid, t) not in cells]
        if missing:
            raise TraceError(
                f"{path}: request {rid}, forward {s}: no row for layer {missing[0][0]}, token {missing[0][1]} "
                f"(every MoE layer routes every token row of a forward)"
            )
        first_line, first = min(cells.values(), key=lambda x: x[0])
        vals = _forward_fields(path, header, rid, s, T, seen, cells, first_line, first)
        phase[s], block[s], sib[s], kv[s], dec[s] = vals
        seen += T
        offsets.append(offsets[-1] + T)
        ids = np.zeros((T, L, k), np.int16)
        w = np.full((T, L, k), 1.0 / k, np.float32)
        c = np.full(T, np.nan, np.float32)
        wm = np.zeros(T, bool)
        dd = np.zeros(T, bool)
        for (lid, t), (n, r) in cells.items():
            j = layer_index[lid]
            ids[t, j] = r["experts"]
            if "weights" in r:
                w[t, j] = r["weights"]
            if "confidence" in r:
                cf = r["confidence"]
                if not isinstance(cf, (int, float)) or not (0.0 <= cf <= 1.0):
                    raise TraceError(f"{path}, line {n}, field 'confidence': {cf!r} must be in [0, 1]")
                c[t] = cf
            ar_decode = header.decoding == "autoregressive" and phase[s] != PREFILL
            wm[t] = bool(r.get("was_masked", ar_decode))
            dd[t] = bool(r.get("decoded", ar_decode))
        ids_all.append(ids)
        w_all.append(w)
        conf.append(c)
        masked.append(wm)
        decoded.append(dd)
    prompt = int(offsets[1]) if phase[0] == PREFILL else 0
    return RequestArrays(
        request_id=int(rid),
        phase=phase,
        block=block,
        step_in_block=sib,
        kv_len=kv,
        n_decoded=dec,
        row_offset=np.asarray(offsets, np.int64),
        ids=np.concatenate(ids_all),
        weights=np.concatenate(w_all),
        confidence=np.concatenate(conf),
        was_masked=np.concatenate(masked),
        decoded=np.concatenate(decoded),
        prompt_len=prompt,
        prompt_hash="",
    )


def _forward_fields(path, header, rid, s, T, seen, cells, first_line, first):
    """(phase, block, step_in_block, kv_len, n_decoded) of forward ``s``: the log's, or the autoregressive defaults."""
    given = {f: first[f] for f in FORWARD_FIELDS if f in first}
    for n, r in cells.values():
        for f in FORWARD_FIELDS:
            if r.get(f, given.get(f)) != given.get(f):
                raise TraceError(
                    f"{path}, line {n}, field {f!r}: {r.get(f)!r} differs from line {first_line}'s {given.get(f)!r} "
                    f"(a forward's fields are the same on all its rows)"
                )
    if header.decoding == "block-diffusion":
        missing = [f for f in FORWARD_FIELDS if f not in given]
        if missing:
            raise TraceError(
                f"{path}, line {first_line}: a block-diffusion log gives {missing[0]!r} for every forward "
                f"(request {rid}, forward {s})"
            )
    ph = given.get("phase", "prefill" if s == 0 else "denoise")
    if ph not in PHASES:
        raise TraceError(f"{path}, line {first_line}, field 'phase': {ph!r}; one of {', '.join(PHASES)}")
    p = PHASES.index(ph)
    out = [p, given.get("block", s), given.get("step_in_block", 0), given.get("kv_len", seen)]
    out.append(given.get("n_decoded", 0 if p == PREFILL else T))
    for f, v in zip(("block", "step_in_block", "kv_len", "n_decoded"), out[1:]):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise TraceError(f"{path}, line {first_line}, field {f!r}: {v!r} must be an integer >= 0")
    return out


def import_trace(src, out, overwrite: bool = False) -> Path:
    """The interchange file ``src`` written as a trace directory at ``out`` (every request checked on the way)."""
    from dllm_offload_sim.traces.writer import write_trace

    header, topo, reqs, weighted = read_interchange(src)
    return write_trace(
        out,
        topo,
        reqs,
        source="collected",
        decoding={"block_length": header.block_length, "mode": header.decoding},
        dataset=header.dataset or Path(src).stem,
        extra={
            "imported_from": str(src),
            "engine": header.engine,
            "gate_weights": "from the log" if weighted else "uniform 1/top_k (the log gave none)",
        },
        overwrite=overwrite,
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="dllm-trace-import",
        description="Turn a routing log in the interchange format (docs/traces.md) into a trace directory.",
        formatter_class=HelpFormatter,
        epilog="Example: dllm-trace-import routing.jsonl --out traces_out/mine && dllm-trace-check traces_out/mine",
    )
    p.add_argument(
        "file", help="an interchange file (JSON Lines: a header line, then one line per routed row)"
    )
    p.add_argument("--out", required=True, help="the trace directory to write (a new one)")
    p.add_argument("--overwrite", action="store_true", help="replace a trace this project wrote at --out")
    args = p.parse_args(argv)
    try:
        out = import_trace(args.file, args.out, overwrite=args.overwrite)
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


cli = entry_point(main)  # console entry point ``dllm-trace-import``


if __name__ == "__main__":
    cli()
