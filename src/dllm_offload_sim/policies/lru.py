"""Per-layer LRU expert cache with eviction during execution (mixtral-offloading style)."""

from __future__ import annotations

from collections import OrderedDict

from dllm_offload_sim.policies.base import LayerDecision, LayerView, Policy


class LRUPolicy(Policy):
    """Classic per-access LRU per MoE layer; every miss is copied to the GPU.

    Decides: all misses go to the GPU. Each copied expert is inserted into the layer's cache as it
    arrives, evicting the least recently used resident that the current layer does not use; when
    every slot holds an expert in use, the copy bypasses the cache (a scratch buffer). Hits are
    touched in expert-id order, then inserted misses in copy order. Source: the per-layer LRU
    "eviction group" of mixtral-offloading (Eliseev & Mazur, 2023).
    """

    name = "lru"

    def setup(self, ctx):
        super().setup(ctx)
        self.order = [OrderedDict() for _ in range(ctx.n_layers)]  # expert -> None, LRU first

    def decide(self, view: LayerView) -> LayerDecision:
        od = self.order[view.layer]
        for e in list(od):
            if e not in view.resident:  # trimmed or evicted elsewhere
                del od[e]
        for e in view.resident:
            if e not in od:
                od[e] = None
                od.move_to_end(e, last=False)
        active = set(view.active.tolist())
        for e in sorted(active & view.resident):
            od.move_to_end(e)
        to_gpu = view.missed.tolist()
        # each copy takes a free slot, else evicts the least recently used resident this layer does not use
        # (copies are inserted as used, so they are never victims): the victims are the first such residents
        # in LRU order; once there are none left, the remaining copies bypass the cache (a scratch buffer)
        free = max(view.capacity - len(od), 0)
        need = max(len(to_gpu) - free, 0)
        victims = []
        if need:
            for v in od:
                if v not in active:
                    victims.append(v)
                    if len(victims) == need:
                        break
            for v in victims:
                del od[v]
        for e in to_gpu[: free + len(victims)]:
            od[e] = None
        return LayerDecision(to_gpu=to_gpu, to_cpu=[], retain=set(od))

    def trim(self, layer, resident, capacity):
        od = self.order[layer]
        ranked = [e for e in reversed(od) if e in resident] + sorted(e for e in resident if e not in od)
        keep = set(ranked[:capacity])
        for e in list(od):
            if e not in keep:
                del od[e]
        return keep
