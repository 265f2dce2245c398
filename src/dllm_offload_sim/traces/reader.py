"""Trace reader: validates on load and hands out one request at a time as dense numpy arrays.

``Trace.open(path)`` checks ``meta.json`` and that every table is a readable Parquet file with the
expected columns; ``trace.request(rid)`` reads only that request's row groups and checks its rows
(ids in range, k consistent, steps contiguous, no NaN where not allowed, no negative sizes).
Every error is a :class:`TraceFormatError` naming the file, column and first bad row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dllm_offload_sim.traces.errors import TraceError, TraceFormatError
from dllm_offload_sim.traces.schema import (
    META_FILE,
    PHASES,
    ROUTING_FILE,
    SCHEMA_VERSION,
    SOURCES,
    STEPS_FILE,
    TABLE_FILES,
    TOKENS_FILE,
    RequestArrays,
    routing_schema,
    steps_schema,
    tokens_schema,
)
from dllm_offload_sim.traces.topology import ModelTopology


def _load_meta(path: Path) -> dict:
    f = path / META_FILE
    if not f.is_file():
        raise TraceFormatError(f, "missing: a trace directory needs meta.json")
    try:
        meta = json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceFormatError(f, f"not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise TraceFormatError(
            f, f"top level must be a JSON object (a trace's meta), got a {type(meta).__name__}"
        )
    sv = meta.get("schema_version")
    if sv != SCHEMA_VERSION:
        what = "missing" if sv is None else f"schema_version is {sv!r}"
        raise TraceFormatError(
            f, f"{what}; this reader understands {SCHEMA_VERSION}", column="schema_version"
        )
    if meta.get("source") not in SOURCES:
        raise TraceFormatError(
            f, f"source is {meta.get('source')!r}; expected one of {SOURCES}", column="source"
        )
    for key in ("model", "decoding", "requests"):
        if key not in meta:
            raise TraceFormatError(f, "missing field", column=key)
    bl = meta["decoding"].get("block_length")
    if not isinstance(bl, int) or bl <= 0:
        raise TraceFormatError(
            f, f"block_length must be a positive integer, got {bl!r}", column="decoding.block_length"
        )
    reqs = meta["requests"]
    if not isinstance(reqs, list):
        raise TraceFormatError(f, "must be a list", column="requests")
    if meta.get("n_requests", len(reqs)) != len(reqs):
        raise TraceFormatError(
            f, f"n_requests={meta.get('n_requests')} but {len(reqs)} requests listed", column="n_requests"
        )
    seen = set()
    for i, r in enumerate(reqs):
        rid = r.get("request_id") if isinstance(r, dict) else None
        if not isinstance(rid, int) or rid < 0 or rid in seen:
            raise TraceFormatError(
                f, f"bad or duplicate request_id {rid!r}", column="requests.request_id", row=i
            )
        if int(r.get("prompt_len", 0)) < 0:
            raise TraceFormatError(
                f, f"negative prompt_len {r.get('prompt_len')}", column="requests.prompt_len", row=i
            )
        seen.add(rid)
    try:
        ModelTopology.from_dict(meta["model"])
    except TraceError as e:
        raise TraceFormatError(f, str(e), column="model") from None
    return meta


def _open_parquet(f: Path, expected: pa.Schema) -> pq.ParquetFile:
    if not f.is_file():
        raise TraceFormatError(f, "missing table file")
    try:
        pf = pq.ParquetFile(f)
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError for truncated or corrupt files
        raise TraceFormatError(f, f"unreadable Parquet (truncated or corrupt): {e}") from None
    have = pf.schema_arrow
    for fld in expected:
        if fld.name not in have.names:
            raise TraceFormatError(f, "missing column", column=fld.name)
        t = have.field(fld.name).type
        ok = (
            t == fld.type
            or (pa.types.is_integer(t) and pa.types.is_integer(fld.type))
            or (pa.types.is_floating(t) and pa.types.is_floating(fld.type))
            or (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t))
            and pa.types.is_string(fld.type)
            or (_is_list(t) and _is_list(fld.type))
        )
        if not ok:
            raise TraceFormatError(f, f"type {t} where {fld.type} is expected", column=fld.name)
    return pf


def _is_list(t) -> bool:
    return pa.types.is_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_large_list(t)


READ_BATCH_ROWS = 1 << 16  # rows of a Parquet file decoded at once when a request is read


@dataclass
class _TableIndex:
    """Where each request's rows live in one Parquet file: row groups and their first file row."""

    pf: pq.ParquetFile
    path: Path
    groups: dict  # request_id -> list of (row_group, first_file_row)

    @classmethod
    def build(cls, pf: pq.ParquetFile, path: Path) -> "_TableIndex":
        groups: dict[int, list] = {}
        md = pf.metadata
        col = pf.schema_arrow.get_field_index("request_id")
        first = 0
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            st = rg.column(col).statistics
            if st is not None and st.has_min_max:
                lo, hi = int(st.min), int(st.max)
                rids = range(lo, hi + 1) if hi - lo < 100_000 else None
            else:
                rids = None
            if rids is None:  # no usable statistics: read the column of this group
                rids = np.unique(pf.read_row_group(g, columns=["request_id"]).column(0).to_numpy())
            for r in rids:
                groups.setdefault(int(r), []).append((g, first))
            first += rg.num_rows
        return cls(pf, path, groups)

    def unlisted(self, listed: set) -> list[int]:
        """The request ids the file holds that ``listed`` lacks, sorted. A row group whose statistics' range holds
        listed ids only is not read; any other has its request_id column read, one group at a time."""
        suspect = sorted({g for rid, gs in self.groups.items() if rid not in listed for g, _ in gs})
        held: set = set()
        for g in suspect:
            try:
                col = self.pf.read_row_group(g, columns=["request_id"]).column(0).to_numpy()
            except Exception as e:
                raise TraceFormatError(self.path, f"unreadable request_id column: {e}") from None
            held.update(int(r) for r in np.unique(col))
        return sorted(held - listed)

    def read(self, rid: int) -> tuple[pa.Table, np.ndarray]:
        """The rows of request ``rid`` and their row numbers in the file."""
        parts, rows = [], []
        for g, first in self.groups.get(rid, []):
            # in batches of READ_BATCH_ROWS, each cut to this request's rows: a read holds about the request's rows,
            # not the whole group's nor the group's decompression buffers (half the peak of one read_row_group)
            try:
                for b in self.pf.iter_batches(batch_size=READ_BATCH_ROWS, row_groups=[g]):
                    r = b.column("request_id").to_numpy(zero_copy_only=False)
                    keep = np.flatnonzero(r == rid)
                    if len(keep):
                        parts.append(b if len(keep) == b.num_rows else b.take(pa.array(keep)))
                        rows.append(first + keep)
                    first += b.num_rows
            except Exception as e:
                raise TraceFormatError(
                    self.path, f"unreadable row group {g} (truncated or corrupt): {e}"
                ) from None
        if not parts:
            return None, np.zeros(0, np.int64)
        return pa.Table.from_batches(parts), np.concatenate(rows)


def _ints(table: pa.Table, name: str, f: Path, file_rows: np.ndarray, dtype=np.int64) -> np.ndarray:
    """Integer column ``name`` as ``dtype``; a null, or a value ``dtype`` cannot hold, is a format error."""
    col = table.column(name)
    if col.null_count:
        bad = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise TraceFormatError(f, "null value", column=name, row=int(file_rows[bad]))
    v = col.to_numpy(zero_copy_only=False)
    if v.dtype.kind in "iu" and np.dtype(dtype).itemsize < v.dtype.itemsize and len(v):
        info = np.iinfo(dtype)
        out = (v < info.min) | (v > info.max)
        if np.any(out):
            i = _first(out)
            raise TraceFormatError(f, f"value {v[i]} out of range", column=name, row=int(file_rows[i]))
    return v.astype(dtype, copy=False)


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _list_values(table: pa.Table, name: str, k: int, f: Path, file_rows: np.ndarray) -> np.ndarray:
    col = table.column(name).combine_chunks()
    if col.null_count:
        raise TraceFormatError(
            f,
            "null list",
            column=name,
            row=int(file_rows[_first(col.is_null().to_numpy(zero_copy_only=False))]),
        )
    if pa.types.is_fixed_size_list(col.type):
        if col.type.list_size != k:
            raise TraceFormatError(
                f,
                f"lists have {col.type.list_size} entries but meta top_k is {k}",
                column=name,
                row=int(file_rows[0]) if len(file_rows) else 0,
            )
        flat = col.flatten()
    else:
        lens = np.diff(col.offsets.to_numpy())
        if np.any(lens != k):
            i = _first(lens != k)
            raise TraceFormatError(
                f, f"list has {lens[i]} entries but meta top_k is {k}", column=name, row=int(file_rows[i])
            )
        flat = col.flatten()
    if flat.null_count:
        i = _first(flat.is_null().to_numpy(zero_copy_only=False)) // k
        raise TraceFormatError(f, "null inside list", column=name, row=int(file_rows[i]))
    return flat.to_numpy(zero_copy_only=False).reshape(-1, k)


class Trace:
    """An opened, validated trace directory. Requests are read lazily with :meth:`request`."""

    def __init__(self, path, meta: dict, indexes: dict[str, _TableIndex]):
        self.path = Path(path)
        self.meta = meta
        self.topology = ModelTopology.from_dict(meta["model"])
        self._idx = indexes

    @classmethod
    def open(cls, path) -> "Trace":
        """A trace directory, or a shipped trace by name (``traces.shipped.resolve_trace``), opened and checked."""
        from dllm_offload_sim.traces.shipped import SHIPPED_TRACES, resolve_trace

        path = resolve_trace(path)
        if not path.is_dir():
            raise TraceError(
                f"{path}: no such trace directory (a shipped trace is named by itself: {', '.join(SHIPPED_TRACES)}; "
                f"dllm-synth --out {path} [--model flash] writes a synthetic one there)"
            )
        meta = _load_meta(path)
        k = int(meta["model"]["top_k"])
        schemas = {STEPS_FILE: steps_schema(), ROUTING_FILE: routing_schema(k), TOKENS_FILE: tokens_schema()}
        idx = {}
        for fname in TABLE_FILES:
            f = path / fname
            pf = _open_parquet(f, schemas[fname])
            try:
                idx[fname] = _TableIndex.build(pf, f)
            except TraceFormatError:
                raise
            except Exception as e:
                raise TraceFormatError(f, f"unreadable Parquet metadata: {e}") from None
        listed = {int(r["request_id"]) for r in meta["requests"]}
        for fname in TABLE_FILES:  # rows of a request meta.json does not list would be dropped without a word
            extra = idx[fname].unlisted(listed)
            if extra:
                raise TraceFormatError(
                    path / fname,
                    f"holds rows of request {extra[0]}"
                    f"{f' (and {len(extra) - 1} more)' if len(extra) > 1 else ''}, which "
                    f"{META_FILE} does not list (it lists {sorted(listed)[:10]})",
                    column="request_id",
                )
        return cls(path, meta, idx)

    # ---- facts -------------------------------------------------------------------------------
    @property
    def routing_rows(self) -> int:
        """Rows of the routing table (one per token row, MoE layer and forward), from the file's metadata."""
        return int(self._idx[ROUTING_FILE].pf.metadata.num_rows)

    @property
    def request_ids(self) -> list[int]:
        return [int(r["request_id"]) for r in self.meta["requests"]]

    @property
    def block_length(self) -> int:
        return int(self.meta["decoding"]["block_length"])

    @property
    def source(self) -> str:
        return self.meta["source"]

    def __len__(self) -> int:
        return len(self.meta["requests"])

    def __repr__(self) -> str:
        return f"Trace({self.path}, {self.topology.name}, {len(self)} requests, block {self.block_length})"

    # ---- reading -----------------------------------------------------------------------------
    def request(self, rid: int) -> RequestArrays:
        """Read and validate one request, returning it as dense arrays."""
        rid = int(rid)
        info = next((r for r in self.meta["requests"] if r["request_id"] == rid), None)
        if info is None:
            raise TraceError(f"{self.path / META_FILE}: no request_id {rid}; have {self.request_ids[:10]}...")
        topo = self.topology
        L, k, E = topo.n_moe_layers, topo.top_k, topo.n_experts

        # ---- steps
        f = self.path / STEPS_FILE
        st, st_rows = self._idx[STEPS_FILE].read(rid)
        if st is None or st.num_rows == 0:
            raise TraceFormatError(
                f, f"request {rid} is listed in meta.json but has no steps", column="request_id"
            )
        step = _ints(st, "step", f, st_rows)
        order = np.argsort(step, kind="stable")
        st, st_rows, step = st.take(pa.array(order)), st_rows[order], step[order]
        if step[0] != 0 or np.any(np.diff(step) != 1):
            bad = 0 if step[0] != 0 else _first(np.diff(step) != 1) + 1
            raise TraceFormatError(
                f,
                f"steps of request {rid} are not contiguous from 0 (found {step[bad]})",
                column="step",
                row=int(st_rows[bad]),
            )
        phase_str = st.column("phase").to_pylist()
        phase = np.empty(len(phase_str), np.int8)
        for i, p in enumerate(phase_str):
            if p not in PHASES:
                raise TraceFormatError(
                    f, f"unknown phase {p!r}; expected one of {PHASES}", column="phase", row=int(st_rows[i])
                )
            phase[i] = PHASES.index(p)
        cols = {}
        for name, lo in (
            ("block", 0),
            ("step_in_block", 0),
            ("n_tokens", 1),
            ("kv_len", 0),
            ("n_decoded", 0),
        ):
            v = _ints(st, name, f, st_rows)
            if np.any(v < lo):
                i = _first(v < lo)
                raise TraceFormatError(f, f"value {v[i]} is below {lo}", column=name, row=int(st_rows[i]))
            cols[name] = v
        n_tok = cols["n_tokens"]
        S = step.shape[0]
        row_offset = np.zeros(S + 1, np.int64)
        np.cumsum(n_tok, out=row_offset[1:])
        N = int(row_offset[-1])

        # ---- routing
        f = self.path / ROUTING_FILE
        rt, rt_rows = self._idx[ROUTING_FILE].read(rid)
        if rt is None:
            raise TraceFormatError(f, f"no routing rows for request {rid}", column="request_id")
        # one entry per (forward, layer, token row), so held as int32 (a value beyond it is a format error)
        r_step = _ints(rt, "step", f, rt_rows, np.int32)
        r_layer = _ints(rt, "layer", f, rt_rows, np.int32)
        r_row = _ints(rt, "row", f, rt_rows, np.int32)
        # each column leaves the table once it is read, so a read holds about one copy of the request's rows
        rt = rt.select(["expert_ids", "gate_weights"])
        if np.any((r_step < 0) | (r_step >= S)):
            i = _first((r_step < 0) | (r_step >= S))
            raise TraceFormatError(
                f, f"step {r_step[i]} not in steps table (0..{S - 1})", column="step", row=int(rt_rows[i])
            )
        lut = np.full(max(topo.moe_layers) + 1, -1, np.int64)
        lut[list(topo.moe_layers)] = np.arange(L)
        bad = (r_layer < 0) | (r_layer >= lut.shape[0])
        li = np.where(bad, -1, lut[np.clip(r_layer, 0, lut.shape[0] - 1)])
        if np.any(li < 0):
            i = _first(li < 0)
            raise TraceFormatError(
                f,
                f"layer {r_layer[i]} is not a MoE layer of {topo.name} {list(topo.moe_layers)}",
                column="layer",
                row=int(rt_rows[i]),
            )
        if np.any((r_row < 0) | (r_row >= n_tok[r_step])):
            i = _first((r_row < 0) | (r_row >= n_tok[r_step]))
            raise TraceFormatError(
                f,
                f"row {r_row[i]} outside 0..{n_tok[r_step[i]] - 1} of step {r_step[i]}",
                column="row",
                row=int(rt_rows[i]),
            )
        ids = _list_values(rt, "expert_ids", k, f, rt_rows)
        rt = rt.select(["gate_weights"])
        if np.any((ids < 0) | (ids >= E)):
            i = _first(np.any((ids < 0) | (ids >= E), axis=1))
            raise TraceFormatError(
                f,
                f"expert id out of range 0..{E - 1}: {ids[i].tolist()}",
                column="expert_ids",
                row=int(rt_rows[i]),
            )
        dup = np.zeros(len(ids), bool)
        for a in range(k):  # k(k-1)/2 column comparisons: cheaper than sorting every row for top-k <= 16
            for b in range(a + 1, k):
                dup |= ids[:, a] == ids[:, b]
        if np.any(dup):
            i = _first(dup)
            raise TraceFormatError(
                f, f"repeated expert in one row: {ids[i].tolist()}", column="expert_ids", row=int(rt_rows[i])
            )
        w = _list_values(rt, "gate_weights", k, f, rt_rows).astype(np.float32, copy=False)
        del rt
        badw = ~np.isfinite(w) | (w < 0)
        if np.any(badw):
            i = _first(np.any(badw, axis=1))
            raise TraceFormatError(
                f,
                f"gate weight not finite and >= 0: {w[i].tolist()}",
                column="gate_weights",
                row=int(rt_rows[i]),
            )
        dest = row_offset[r_step] + r_row
        flat = dest * L + li
        count = np.bincount(flat, minlength=N * L)
        if count.shape[0] != N * L or np.any(count != 1):
            cell = _first(count != 1) if count.shape[0] == N * L else N * L
            s_bad = int(np.searchsorted(row_offset, cell // L, side="right") - 1)
            how = "duplicated" if cell < count.shape[0] and count[cell] > 1 else "missing"
            loc = np.flatnonzero(flat == cell)
            row = int(rt_rows[loc[1]]) if how == "duplicated" else None
            raise TraceFormatError(
                f,
                f"request {rid}: routing for step {s_bad}, layer {topo.moe_layers[cell % L]}, token row "
                f"{cell // L - row_offset[s_bad]} is {how} (each forward needs n_tokens rows per MoE layer)",
                column="row",
                row=row,
            )
        del (
            r_step,
            r_layer,
            r_row,
            flat,
            count,
            dup,
            badw,
        )  # the read's peak: free what is done with first
        out_ids = np.empty((N, L, k), np.int16)
        out_w = np.empty((N, L, k), np.float32)
        out_ids[dest, li] = ids
        out_w[dest, li] = w

        # ---- tokens
        f = self.path / TOKENS_FILE
        tk, tk_rows = self._idx[TOKENS_FILE].read(rid)
        if tk is None:
            raise TraceFormatError(f, f"no token rows for request {rid}", column="request_id")
        t_step = _ints(tk, "step", f, tk_rows)
        t_row = _ints(tk, "row", f, tk_rows)
        okr = (t_step >= 0) & (t_step < S)
        okr &= (t_row >= 0) & (t_row < n_tok[np.clip(t_step, 0, S - 1)])
        if not np.all(okr):
            i = _first(~okr)
            raise TraceFormatError(
                f,
                f"(step {t_step[i]}, row {t_row[i]}) not in the steps table",
                column="row",
                row=int(tk_rows[i]),
            )
        tdest = row_offset[t_step] + t_row
        cnt = np.bincount(tdest, minlength=N)
        if np.any(cnt != 1):
            cell = _first(cnt != 1)
            s_bad = int(np.searchsorted(row_offset, cell, side="right") - 1)
            raise TraceFormatError(
                f,
                f"request {rid}: token row {cell - row_offset[s_bad]} of step {s_bad} is "
                f"{'duplicated' if cnt[cell] > 1 else 'missing'}",
                column="row",
            )
        conf = tk.column("confidence").to_numpy(zero_copy_only=False).astype(np.float32)
        badc = ~np.isnan(conf) & ((conf < 0) | (conf > 1))
        if np.any(badc):
            i = _first(badc)
            raise TraceFormatError(
                f, f"confidence {conf[i]} outside [0, 1]", column="confidence", row=int(tk_rows[i])
            )
        arrs = {}
        for name in ("was_masked", "decoded_this_step"):
            col = tk.column(name)
            if col.null_count:
                i = _first(col.is_null().to_numpy(zero_copy_only=False))
                raise TraceFormatError(f, "null value", column=name, row=int(tk_rows[i]))
            arrs[name] = col.to_numpy(zero_copy_only=False).astype(bool)
        out_conf = np.empty(N, np.float32)
        out_mask = np.empty(N, bool)
        out_dec = np.empty(N, bool)
        out_conf[tdest], out_mask[tdest], out_dec[tdest] = conf, arrs["was_masked"], arrs["decoded_this_step"]
        # the two tables must agree on what each step decoded (TPOT divides by it)
        marked = np.bincount(np.repeat(np.arange(S), n_tok), weights=out_dec, minlength=S).astype(np.int64)
        if np.any(marked != cols["n_decoded"]):
            i = _first(marked != cols["n_decoded"])
            raise TraceFormatError(
                self.path / STEPS_FILE,
                f"request {rid}, step {i}: n_decoded is "
                f"{cols['n_decoded'][i]} but {TOKENS_FILE} marks {marked[i]} of its rows "
                f"decoded_this_step",
                column="n_decoded",
                row=int(st_rows[i]),
            )
        # a cached length beyond every token the request ever holds is not a length this request can reach
        most = int(row_offset[-1]) + int(info.get("prompt_len", 0) or 0)
        if np.any(cols["kv_len"] > most):
            i = _first(cols["kv_len"] > most)
            raise TraceFormatError(
                self.path / STEPS_FILE,
                f"request {rid}, step {i}: kv_len {cols['kv_len'][i]} "
                f"exceeds the {most} tokens the request holds in all (prompt and every row)",
                column="kv_len",
                row=int(st_rows[i]),
            )

        return RequestArrays(
            request_id=rid,
            phase=phase,
            block=cols["block"].astype(np.int32),
            step_in_block=cols["step_in_block"].astype(np.int32),
            kv_len=cols["kv_len"].astype(np.int32),
            n_decoded=cols["n_decoded"].astype(np.int32),
            row_offset=row_offset,
            ids=out_ids,
            weights=out_w,
            confidence=out_conf,
            was_masked=out_mask,
            decoded=out_dec,
            prompt_len=int(info.get("prompt_len", 0)),
            prompt_hash=str(info.get("prompt_hash", "")),
        )

    def requests(self, ids=None):
        """Iterate over (validated) requests, all of them or those in ``ids``."""
        for rid in self.request_ids if ids is None else ids:
            yield self.request(rid)

    def validate(self) -> None:
        """Read and check every request (``Trace.open`` checks only meta and table schemas)."""
        for _ in self.requests():
            pass


def open_trace(path) -> Trace:
    """Open and validate a trace directory (shorthand for ``Trace.open``)."""
    return Trace.open(path)
