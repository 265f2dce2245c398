"""TraceWriter: streams requests into a trace directory that appears only once complete."""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dllm_offload_sim.traces.atomic import atomic_directory, atomic_write_json, parquet_write_options
from dllm_offload_sim.traces.errors import TraceError
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

TOOL_VERSION = "0.1.0"


def request_tables(req: RequestArrays, topology: ModelTopology) -> tuple[pa.Table, pa.Table, pa.Table]:
    """The three format tables (steps, routing, tokens) for one request."""
    req.check_shapes()
    S, L, k = req.n_steps, topology.n_moe_layers, topology.top_k
    if req.ids.shape[1:] != (L, k):
        raise TraceError(
            f"request {req.request_id}: ids shape {req.ids.shape[1:]} != (moe layers {L}, k {k})"
        )
    n_tok = req.n_tokens
    rid = np.int32(req.request_id)
    steps = pa.table(
        {
            "request_id": np.full(S, rid, np.int32),
            "step": np.arange(S, dtype=np.int32),
            "phase": pa.array([PHASES[p] for p in req.phase], pa.string()),
            "block": req.block.astype(np.int32),
            "step_in_block": req.step_in_block.astype(np.int32),
            "n_tokens": n_tok,
            "kv_len": req.kv_len.astype(np.int32),
            "n_decoded": req.n_decoded.astype(np.int32),
        },
        schema=steps_schema(),
    )

    # routing rows ordered (step, layer, row): gather index into the [N, L] grid
    step_of_row = np.repeat(np.arange(S, dtype=np.int32), n_tok)
    row_in_step = (np.arange(req.row_offset[-1]) - np.repeat(req.row_offset[:-1], n_tok)).astype(np.int32)
    order_n = (
        np.concatenate([np.tile(np.arange(req.row_offset[s], req.row_offset[s + 1]), L) for s in range(S)])
        if S
        else np.zeros(0, np.int64)
    )
    order_l = (
        np.concatenate([np.repeat(np.arange(L), n_tok[s]) for s in range(S)]) if S else np.zeros(0, np.int64)
    )
    moe_ids = np.asarray(topology.moe_layers, np.int16)
    ids = req.ids[order_n, order_l].astype(np.int16).reshape(-1)
    wts = req.weights[order_n, order_l].astype(np.float32).reshape(-1)
    routing = pa.table(
        {
            "request_id": np.full(order_n.shape[0], rid, np.int32),
            "step": step_of_row[order_n],
            "layer": moe_ids[order_l],
            "row": row_in_step[order_n],
            "expert_ids": pa.FixedSizeListArray.from_arrays(pa.array(ids, pa.int16()), k),
            "gate_weights": pa.FixedSizeListArray.from_arrays(pa.array(wts, pa.float32()), k),
        },
        schema=routing_schema(k),
    )

    tokens = pa.table(
        {
            "request_id": np.full(req.row_offset[-1], rid, np.int32),
            "step": step_of_row,
            "row": row_in_step,
            "confidence": req.confidence.astype(np.float32),
            "was_masked": req.was_masked.astype(bool),
            "decoded_this_step": req.decoded.astype(bool),
        },
        schema=tokens_schema(),
    )
    return steps, routing, tokens


def is_trace_meta(path: Path) -> bool:
    """Whether ``path`` (a ``meta.json``) is a trace's: a JSON object with this format's ``schema_version``, a
    ``model`` and a ``source``."""
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(d, dict) and "schema_version" in d and isinstance(d.get("model"), dict) and "source" in d
    )


class TraceWriter:
    """Write requests one by one; the trace directory appears atomically on ``close()``.

    Use as a context manager. If the block raises, nothing is left at ``path``; an existing trace at
    ``path`` is refused (or, with ``overwrite=True``, replaced only once the new one is complete).
    """

    def __init__(
        self,
        path,
        topology: ModelTopology,
        source: str,
        decoding: dict,
        dataset: str,
        extra: dict | None = None,
        overwrite: bool = False,
    ):
        if source not in SOURCES:
            raise TraceError(f"source must be one of {SOURCES}, got {source!r}")
        if int(decoding.get("block_length", 0)) <= 0:
            raise TraceError(f"decoding.block_length must be > 0, got {decoding.get('block_length')!r}")
        self.path = Path(path)
        self.topology = topology
        self.meta = {
            "schema_version": SCHEMA_VERSION,
            "source": source,
            "model": topology.to_dict(),
            "decoding": dict(decoding),
            "dataset": dataset,
            "tool_version": TOOL_VERSION,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            **({"extra": extra} if extra else {}),
        }
        self._requests: list[dict] = []
        self._ctx = atomic_directory(
            self.path, overwrite=overwrite, owned=(META_FILE, *TABLE_FILES), is_ours=is_trace_meta
        )
        self._tmp: Path | None = None
        self._writers: dict[str, pq.ParquetWriter] = {}

    def __enter__(self) -> "TraceWriter":
        self._tmp = self._ctx.__enter__()
        k = self.topology.top_k
        for fname, schema in (
            (STEPS_FILE, steps_schema()),
            (ROUTING_FILE, routing_schema(k)),
            (TOKENS_FILE, tokens_schema()),
        ):
            self._writers[fname] = pq.ParquetWriter(
                self._tmp / fname, schema, **parquet_write_options(schema)
            )
        return self

    def add(self, req: RequestArrays) -> None:
        """Append one request (its rows become one row group in each table)."""
        if self._tmp is None:
            raise TraceError("TraceWriter.add called outside its 'with' block")
        if any(r["request_id"] == req.request_id for r in self._requests):
            raise TraceError(f"request_id {req.request_id} written twice to {self.path}")
        steps, routing, tokens = request_tables(req, self.topology)
        for fname, table in ((STEPS_FILE, steps), (ROUTING_FILE, routing), (TOKENS_FILE, tokens)):
            try:
                self._writers[fname].write_table(table)
            except OSError as e:  # a full disk or a file-size limit: say which file of which trace
                raise _named(e, self.path / fname) from e
        self._requests.append(
            {
                "request_id": int(req.request_id),
                "prompt_len": int(req.prompt_len),
                "prompt_hash": req.prompt_hash,
                "n_steps": req.n_steps,
                "n_generated": int(req.n_decoded.sum()),
                **req.extra,
            }
        )

    def __exit__(self, exc_type, exc, tb):
        close_error = None
        for fname, w in self._writers.items():
            try:
                w.close()
            except OSError as e:  # the last bytes of a table did not fit: say which file
                close_error = close_error or _named(e, self.path / fname)
        if exc_type is None and close_error is not None:
            self._ctx.__exit__(OSError, close_error, None)  # the partial directory is removed
            raise close_error
        if exc_type is None:
            self.meta["n_requests"] = len(self._requests)
            self.meta["requests"] = self._requests
            atomic_write_json(self._tmp / META_FILE, self.meta)
        return self._ctx.__exit__(exc_type, exc, tb)


def _named(e: OSError, path: Path) -> OSError:
    """``e`` as an OSError that names ``path`` (pyarrow's write errors name no file): its errno where it has one, else
    the errno its text gives (``[errno 27]``)."""
    n = e.errno
    if n is None:
        m = re.search(r"errno (\d+)", str(e))
        n = int(m.group(1)) if m else None
    return OSError(n, os.strerror(n) if n else str(e), str(path))


def write_trace(
    path,
    topology: ModelTopology,
    requests,
    source: str,
    decoding: dict,
    dataset: str,
    extra: dict | None = None,
    overwrite: bool = False,
) -> Path:
    """Write an iterable of RequestArrays as a trace directory at ``path``."""
    with TraceWriter(path, topology, source, decoding, dataset, extra=extra, overwrite=overwrite) as w:
        for req in requests:
            w.add(req)
    return Path(path)
