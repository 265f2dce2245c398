"""Per-layer LFU retention: keep the experts activated in the most forwards."""

from __future__ import annotations

import numpy as np

from dllm_offload_sim.policies.base import LayerDecision, LayerView, Policy
from dllm_offload_sim.policies.select import keep_top, keep_top_by


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
        j, f = view.layer, view.forward.index
        self.count[j, view.active] += 1
        self.last[j, view.active] = f
        to_gpu = view.missed.tolist()
        cnt, last = self.count[j], self.last[j]
        cands = np.concatenate([np.fromiter(view.resident, np.int64, len(view.resident)), view.missed])
        retain = keep_top_by(cands, view.capacity, cnt[cands], last[cands])
        return LayerDecision(to_gpu=to_gpu, to_cpu=[], retain=retain)

    def trim(self, layer, resident, capacity):
        cnt, last = self.count[layer], self.last[layer]
        return keep_top(resident, lambda e: (cnt[e], last[e]), capacity)
