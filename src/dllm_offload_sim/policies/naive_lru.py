"""The paper's Naive-LRU: inter-iteration retention of the most recently activated experts."""

from __future__ import annotations

import numpy as np

from dllm_offload_sim.policies.base import LayerDecision, LayerView, Policy
from dllm_offload_sim.policies.select import keep_top, keep_top_by


class NaiveLRUPolicy(Policy):
    """Inter-iteration LRU, the base of OLED-MoE's ablation ladder (paper §3.2, §5.3).

    Decides: every miss is copied to the GPU; after the layer executes, the layer's cache keeps
    the experts used most recently, at iteration granularity: this forward's activated experts
    first (when more of them than slots, the ones that had been used in an earlier forward more
    recently win, then lower id), then older residents by last use. Unlike :class:`LRUPolicy` no
    eviction happens while the layer runs; retention is decided once the layer is done, as in
    OLED-MoE's pipeline with its priority rule replaced by recency.
    """

    name = "naive_lru"

    def setup(self, ctx):
        super().setup(ctx)
        self.last = np.full((ctx.n_layers, ctx.n_experts), -1, np.int64)
        self.prev = np.full((ctx.n_layers, ctx.n_experts), -1, np.int64)

    def decide(self, view: LayerView) -> LayerDecision:
        j, f = view.layer, view.forward.index
        last, prev = self.last[j], self.prev[j]
        prev[view.active] = last[view.active]
        last[view.active] = f
        to_gpu = view.missed.tolist()
        cands = np.concatenate([np.fromiter(view.resident, np.int64, len(view.resident)), view.missed])
        retain = keep_top_by(cands, view.capacity, last[cands], prev[cands])
        return LayerDecision(to_gpu=to_gpu, to_cpu=[], retain=retain)

    def trim(self, layer, resident, capacity):
        last, prev = self.last[layer], self.prev[layer]
        return keep_top(resident, lambda e: (last[e], prev[e]), capacity)
