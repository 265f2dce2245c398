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

import numpy as np
import pandas as pd


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
        self.prefetch_copies = 0
        self.prefetch_dropped = 0  # stale or skipped (no victim) prefetches, never copied
        self.prefetch_wasted = 0  # copied but no room on arrival
        self.late_prefetch_hits = 0
        self.transfers_decode = 0
        self.effective = 0
        self.demand_bytes = 0.0
        self.prefetch_bytes = 0.0
        self.forwards: list[tuple] = []
        self.policy_wall_s = 0.0
        self.policy_calls = 0

    def layer(self, j: int, n_active: int, n_hits: int, capacity: int, n_gpu: int, n_cpu: int, decode: bool) -> None:
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

    def forward(self, row: tuple) -> None:
        self.forwards.append(row)

    # nonexpert_s: attention, norms, gate, shared expert, dense layers, lm-head; resident_expert_s: the
    # expert compute had every activated expert been resident; the rest of duration_s is miss handling;
    # cpu_path_s: summed over layers with CPU experts, activations out + CPU experts + results back
    FORWARD_COLUMNS = ["forward", "batch", "phase", "measured", "start_s", "duration_s", "n_tokens", "kv_len",
                       "decoded", "hits", "misses", "to_gpu", "to_cpu", "prefetch_copies", "nonexpert_s",
                       "resident_expert_s", "cpu_path_s"]

    def per_forward(self) -> pd.DataFrame:
        return pd.DataFrame(self.forwards, columns=self.FORWARD_COLUMNS)

    def per_layer(self, moe_layers) -> pd.DataFrame:
        a = {k: np.asarray(getattr(self, k), float) for k in ("execs", "active", "hits", "util_sum", "util_n", "cap_sum")}
        z = np.zeros(len(a["execs"]))
        return pd.DataFrame({
            "layer": list(moe_layers),
            "executions": a["execs"].astype(int),
            "mean_active": a["active"] / np.maximum(a["execs"], 1),
            "hit_rate": np.divide(a["hits"], a["active"], out=z.copy(), where=a["active"] > 0),
            "cache_util": np.divide(a["util_sum"], a["util_n"], out=z.copy(), where=a["util_n"] > 0),
            "mean_capacity": np.divide(a["cap_sum"], a["util_n"], out=z.copy(), where=a["util_n"] > 0),
            "demand_copies": np.asarray(self.demand, int),
            "cpu_experts": np.asarray(self.cpu, int),
        })
