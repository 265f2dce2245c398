"""Per-layer LFU retention: keep the experts activated in the most forwards."""

from __future__ import annotations

import numpy as np

from dllm_offload_sim.policies.base import LayerDecision, LayerView, Policy
from dllm_offload_sim.policies.jit import kernel
from dllm_offload_sim.policies.select import keep_top, resident_and, top_of


@kernel
def lfu_retain(
    active, missed, resident_row, capacity, count_row, last_row, forward
):  # pragma: no cover (numba)
    """LFU at one MoE layer of forward ``forward``: the layer's ``active`` experts' activation counts rise by one and
    their last use becomes this forward, and the ``capacity`` experts the layer keeps of its residents
    (``resident_row``, a mask by expert) and its copied ``missed`` experts, by (count, last use), ties to the lower id
    (in no particular order)."""
    for e in active:
        count_row[e] += 1
        last_row[e] = forward
    cands = resident_and(resident_row, missed)
    return top_of(cands, capacity, count_row[cands], last_row[cands])


class LFUPolicy(Policy):
    """Least-frequently-used retention per MoE layer; every miss is copied to the GPU.

    Decides: all misses go to the GPU; after the layer, the ``capacity`` experts among the
    residents and the copied ones with the highest activation count (forwards in which the layer
    activated them, over the whole run) stay; ties go to the more recently used, then lower id.
    Source: the "lfu" alternative of MoE-Infinity's reference scorer (baselines.md §1).
    """

    name = "lfu"

    def setup(self, ctx):
        super().setup(ctx)
        self.count = np.zeros((ctx.n_layers, ctx.n_experts), np.int64)
        self.last = np.full((ctx.n_layers, ctx.n_experts), -1, np.int64)

    def decide(self, view: LayerView) -> LayerDecision:
        j = view.layer
        row = view.resident_row(self.ctx.n_experts)
        retain = lfu_retain(
            view.active, view.missed, row, view.capacity, self.count[j], self.last[j], view.forward.index
        )
        return LayerDecision(to_gpu=view.missed.tolist(), to_cpu=[], retain=set(retain.tolist()))

    def trim(self, layer, resident, capacity):
        cnt, last = self.count[layer], self.last[layer]
        return keep_top(resident, lambda e: (cnt[e], last[e]), capacity)
