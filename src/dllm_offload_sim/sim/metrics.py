"""Metric accumulators of a simulation run: per layer execution, per forward, and the summary row.

Definitions (paper §5.1, §5.3):
* TPOT: decode time (denoise and commit forwards) / tokens decoded, over measured batches.
* TTFT: per request, from its batch's start to the end of the first forward that decodes one of
  its tokens; averaged over requests.
* Expert cache utilisation: per MoE layer execution (decode), the fraction of the layer's cache
  slots holding an expert that this execution activates, before any miss is handled; averaged over
  layers, forwards and requests.
* Hit rate: activated experts already resident (or arriving from an in-flight prefetch) / activated.
* Effective transfer ratio: experts copied to the GPU (demand or prefetch) during a decode forward
  that are hit by the same layer in the next forward / experts copied.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, fields

import numpy as np
import pandas as pd

from dllm_offload_sim.sim.copy_engine import PrefetchCounts


@dataclass(slots=True)
class ForwardRecord:
    """One simulated forward: where it sits, how long it took, what its layers counted, where its time went."""

    forward: int
    batch: int
    request_id: int  # the request the forward decodes for; -1 where it serves several (sim.batch_size > 1)
    phase: int
    measured: bool
    start_s: float
    duration_s: float
    n_tokens: int
    kv_len: int
    decoded: int
    hits: int
    misses: int
    to_gpu: int
    to_cpu: int
    prefetch_copies: int
    nonexpert_s: float  # attention, norms, gate, shared expert, dense layers, lm-head
    resident_expert_s: float  # the expert compute had every activated expert been resident
    cpu_path_s: float  # summed over layers with CPU experts: activations out, CPU experts, results back
    # summed over layers: how much later the CPU call computed, demand copies beside it
    cpu_slowed_s: float = 0.0
    # summed over layers: how much later the demand copies landed, a CPU call beside them
    copies_slowed_s: float = 0.0


FORWARD_COLUMNS = [f.name for f in fields(ForwardRecord)]
# each column's storage while a run goes on: 8 bytes a value (1 for flags), not a Python object a value
_TYPECODES = {"int": "q", "bool": "b", "float": "d"}
_FORWARD_TYPES = [(f.name, _TYPECODES[f.type]) for f in fields(ForwardRecord)]
_DTYPES = {"q": np.int64, "b": np.int8, "d": np.float64}


@dataclass(frozen=True, slots=True)
class FirstToken:
    """The measured forward that decodes a request's first token (what its TTFT ends with), in its batch."""

    request_id: int
    forward: int
    batch: int


class RunMetrics:
    """Accumulates counters while the simulation runs; turns them into tables at the end."""

    def __init__(self, n_layers: int, expert_bytes: int):
        L = n_layers
        self.expert_bytes = expert_bytes
        # plain lists while running (cheap scalar updates); arrays once done
        self.active = [0] * L
        self.hits = [0] * L
        self.util_sum = [0.0] * L
        self.util_n = [0] * L
        self.cap_sum = [0] * L
        self.execs = [0] * L
        self.demand = [0] * L
        self.cpu = [0] * L
        self.prefetch = PrefetchCounts()  # the copy engine's, set when the run ends
        self.late_prefetch_hits = 0
        self.placement_copies = 0  # experts a static placement copied at the start of measured batches
        self.transfers_decode = 0
        self.effective = 0
        self.demand_bytes = 0.0
        self._forward_columns = {
            name: array(code) for name, code in _FORWARD_TYPES
        }  # one per ForwardRecord field
        self._table = None  # the per-forward table, once made
        self.first_tokens: list[FirstToken] = []  # in the order the forwards ran
        self._seen_first: set = set()
        self.policy_wall_s = 0.0  # in the policy's hooks, over the run (the driver's ``policy_wall_s``)
        self.policy_calls = 0
        # of policy_wall_s: the per-forward hooks (the driver's ``forward_hooks_wall_s``)
        self.forward_hooks_wall_s = 0.0

    def layer(
        self, j: int, n_active: int, n_hits: int, capacity: int, n_gpu: int, n_cpu: int, decode: bool
    ) -> None:
        """One measured MoE layer execution."""
        self.execs[j] += 1
        self.active[j] += n_active
        self.hits[j] += n_hits
        self.demand[j] += n_gpu
        self.cpu[j] += n_cpu
        self.demand_bytes += n_gpu * self.expert_bytes
        if decode and capacity > 0:
            self.util_sum[j] += n_hits / capacity
            self.util_n[j] += 1
            self.cap_sum[j] += capacity

    def forward(self, record: "ForwardRecord", decoded: dict) -> None:
        """One forward ran; ``decoded``: request id -> tokens it decoded for that request."""
        if self._table is not None:
            raise RuntimeError("RunMetrics.forward: the per-forward table was already made (the run is over)")
        for name, col in self._forward_columns.items():
            col.append(getattr(record, name))
        if record.measured:
            for rid, n in decoded.items():
                if n > 0 and rid not in self._seen_first:
                    self._seen_first.add(rid)
                    self.first_tokens.append(FirstToken(rid, record.forward, record.batch))

    def per_forward(self) -> pd.DataFrame:
        """One row per forward run, in order, columns as :class:`ForwardRecord`'s fields; made once the run is over
        (no forward is added after it), its numeric columns over the run's own storage (no copy of a long run's
        table)."""
        if self._table is None:
            cols = {}
            for name, code in _FORWARD_TYPES:
                col = self._forward_columns[name]
                a = np.frombuffer(col, _DTYPES[code]) if len(col) else np.zeros(0, _DTYPES[code])
                cols[name] = a.astype(bool) if code == "b" else a
            self._table = pd.DataFrame(cols, columns=FORWARD_COLUMNS, copy=False)
        return self._table

    def per_layer(self, moe_layers) -> pd.DataFrame:
        a = {
            k: np.asarray(getattr(self, k), float)
            for k in ("execs", "active", "hits", "util_sum", "util_n", "cap_sum")
        }
        z = np.zeros(len(a["execs"]))
        return pd.DataFrame(
            {
                "layer": list(moe_layers),
                "executions": a["execs"].astype(int),
                "mean_active": a["active"] / np.maximum(a["execs"], 1),
                "hit_rate": np.divide(a["hits"], a["active"], out=z.copy(), where=a["active"] > 0),
                "cache_util": np.divide(a["util_sum"], a["util_n"], out=z.copy(), where=a["util_n"] > 0),
                "mean_capacity": np.divide(a["cap_sum"], a["util_n"], out=z.copy(), where=a["util_n"] > 0),
                "demand_copies": np.asarray(self.demand, int),
                "cpu_experts": np.asarray(self.cpu, int),
            }
        )
