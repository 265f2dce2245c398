"""The paper's Naive-LRU: inter-iteration retention of the most recently activated experts."""

from __future__ import annotations

import numpy as np

from dllm_offload_sim.policies.base import LayerDecision, LayerView, Policy
from dllm_offload_sim.policies.jit import kernel
from dllm_offload_sim.policies.select import keep_top, resident_and, top_of


@kernel
def naive_lru_retain(active, missed, resident_row, capacity, last_row, prev_row, forward):  # pragma: no cover
    """Naive-LRU at one MoE layer of forward ``forward``: the layer's ``active`` experts' last use becomes this forward
    (``prev_row`` keeps the one before), and the ``capacity`` experts the layer keeps of its residents
    (``resident_row``, a mask by expert) and its copied ``missed`` experts, by (last use, the use before it), ties to
    the lower id (in no particular order)."""
    for e in active:
        prev_row[e] = last_row[e]
        last_row[e] = forward
    cands = resident_and(resident_row, missed)
    return top_of(cands, capacity, last_row[cands], prev_row[cands])


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
        j = view.layer
        row = view.resident_row(self.ctx.n_experts)
        retain = naive_lru_retain(
            view.active, view.missed, row, view.capacity, self.last[j], self.prev[j], view.forward.index
        )
        return LayerDecision(to_gpu=view.missed.tolist(), to_cpu=[], retain=set(retain.tolist()))

    def trim(self, layer, resident, capacity):
        last, prev = self.last[layer], self.prev[layer]
        return keep_top(resident, lambda e: (last[e], prev[e]), capacity)
