"""The trace format, version 1: table schemas, phases, and the in-memory request layout.

A trace directory holds ``meta.json`` and three Parquet tables (see ``docs/trace-format.md``):

* ``steps.parquet``   one row per forward pass;
* ``routing.parquet`` one row per (forward, MoE layer, routed token row) with the top-k expert ids
  and gate weights;
* ``tokens.parquet``  one row per (forward, token row) with the confidence the forward produced.

Tables are sorted by request and written with one Parquet row group per request, so that one request
is read without touching the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

SCHEMA_VERSION = 1
META_FILE = "meta.json"
STEPS_FILE = "steps.parquet"
ROUTING_FILE = "routing.parquet"
TOKENS_FILE = "tokens.parquet"
TABLE_FILES = (STEPS_FILE, ROUTING_FILE, TOKENS_FILE)
SOURCES = ("collected", "synthetic")

PHASES = ("prefill", "denoise", "commit")
PREFILL, DENOISE, COMMIT = 0, 1, 2


def steps_schema() -> pa.Schema:
    return pa.schema(
        [
            ("request_id", pa.int32()),
            ("step", pa.int32()),  # forward index within the request, 0.. contiguous
            ("phase", pa.string()),  # prefill | denoise | commit
            ("block", pa.int32()),  # block index (absolute, aligned to position 0)
            ("step_in_block", pa.int32()),  # 0.. within the block; prefill is 0
            ("n_tokens", pa.int32()),  # token rows routed through every MoE layer in this forward
            ("kv_len", pa.int32()),  # cached positions attended besides the routed rows
            ("n_decoded", pa.int32()),  # tokens unmasked by this forward
        ]
    )


def routing_schema(k: int) -> pa.Schema:
    return pa.schema(
        [
            ("request_id", pa.int32()),
            ("step", pa.int32()),
            ("layer", pa.int16()),  # MoE layer id in model numbering
            ("row", pa.int32()),  # token row within the forward, 0..n_tokens-1
            ("expert_ids", pa.list_(pa.int16(), k)),  # top-k routed experts, in gate order
            ("gate_weights", pa.list_(pa.float32(), k)),  # their combine weights
        ]
    )


def tokens_schema() -> pa.Schema:
    return pa.schema(
        [
            ("request_id", pa.int32()),
            ("step", pa.int32()),
            ("row", pa.int32()),
            ("confidence", pa.float32()),  # max softmax prob of this forward's output; NaN if undefined
            ("was_masked", pa.bool_()),  # the position was a mask token in this forward's input
            ("decoded_this_step", pa.bool_()),  # this forward unmasked it
        ]
    )


@dataclass
class RequestArrays:
    """One request of a trace as dense numpy arrays, the layout the simulator's hot loop reads.

    Token rows of all forwards are concatenated: the rows of step ``s`` are
    ``row_offset[s]:row_offset[s+1]``. ``ids[n, j, :]`` are the top-k experts of row ``n`` at the
    ``j``-th MoE layer (index into ``moe_layers``, not the model layer id).
    """

    request_id: int
    phase: np.ndarray  # int8 [S]: PREFILL / DENOISE / COMMIT
    block: np.ndarray  # int32 [S]
    step_in_block: np.ndarray  # int32 [S]
    kv_len: np.ndarray  # int32 [S]
    n_decoded: np.ndarray  # int32 [S]
    row_offset: np.ndarray  # int64 [S+1]
    ids: np.ndarray  # int16 [N, L, k]
    weights: np.ndarray  # float32 [N, L, k]
    confidence: np.ndarray  # float32 [N]
    was_masked: np.ndarray  # bool [N]
    decoded: np.ndarray  # bool [N]
    prompt_len: int = 0
    prompt_hash: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def n_steps(self) -> int:
        return int(self.phase.shape[0])

    @property
    def n_tokens(self) -> np.ndarray:
        return np.diff(self.row_offset).astype(np.int32)

    def rows(self, step: int) -> slice:
        return slice(int(self.row_offset[step]), int(self.row_offset[step + 1]))

    def decode_steps(self) -> np.ndarray:
        """Indices of the decode-phase forwards (denoise and commit)."""
        return np.flatnonzero(self.phase != PREFILL)

    def check_shapes(self) -> None:
        S = self.n_steps
        for name in ("block", "step_in_block", "kv_len", "n_decoded"):
            if getattr(self, name).shape != (S,):
                raise ValueError(f"{name} has shape {getattr(self, name).shape}, expected ({S},)")
        if self.row_offset.shape != (S + 1,) or self.row_offset[0] != 0:
            raise ValueError("row_offset must have S+1 entries starting at 0")
        N = int(self.row_offset[-1])
        if self.ids.shape[0] != N or self.weights.shape != self.ids.shape:
            raise ValueError(f"ids/weights must have {N} rows and equal shapes")
        for name in ("confidence", "was_masked", "decoded"):
            if getattr(self, name).shape != (N,):
                raise ValueError(f"{name} has shape {getattr(self, name).shape}, expected ({N},)")
