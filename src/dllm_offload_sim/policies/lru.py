"""Per-layer LRU expert cache with eviction during execution (mixtral-offloading style)."""

from __future__ import annotations

import numpy as np

from dllm_offload_sim.policies.base import LayerDecision, LayerView, Policy
from dllm_offload_sim.policies.jit import kernel, stable_argsort
from dllm_offload_sim.policies.select import resident_without


@kernel
def lru_retain(active, missed, resident_row, capacity, stamp_row, clock):  # pragma: no cover (numba)
    """LRU at one MoE layer: what the layer holds once its ``missed`` experts (ascending ids) were copied in.

    ``stamp_row`` is the layer's recency order: each cached expert's stamp from the layer's ``clock`` (a one-element
    array), larger is more recent, -1 for an expert not cached. A resident (``resident_row``, a mask by expert) with no
    stamp ranks as least recent, lower id first; an expert no longer resident loses its stamp. The layer's hits are
    touched in ascending id order. Each copy then takes a free slot, else evicts the least recently used resident
    that the layer does not use (copies are inserted as used, so they are never victims); once no such resident is
    left, the remaining copies bypass the cache. The copies that stay are stamped in copy order. Returns the layer's
    cached experts, ascending."""
    E = resident_row.shape[0]
    used = np.zeros(E, np.bool_)
    for e in active:
        used[e] = True
    n_res = 0
    for e in range(E):
        if resident_row[e]:
            n_res += 1
        else:
            stamp_row[e] = -1
    for e in active:  # ascending ids
        if resident_row[e]:
            clock[0] += 1
            stamp_row[e] = clock[0]
    keep = resident_row.copy()
    free = max(capacity - n_res, 0)
    need = max(missed.shape[0] - free, 0)
    n_victims = 0
    if need:
        cands = resident_without(resident_row, used)
        order = stable_argsort(stamp_row[cands].astype(np.float64))
        n_victims = min(need, cands.shape[0])
        for i in range(n_victims):
            e = cands[order[i]]
            keep[e] = False
            stamp_row[e] = -1
    for i in range(min(missed.shape[0], free + n_victims)):
        e = missed[i]
        clock[0] += 1
        stamp_row[e] = clock[0]
        keep[e] = True
    return np.nonzero(keep)[0]


class LRUPolicy(Policy):
    """Classic per-access LRU per MoE layer; every miss is copied to the GPU.

    Decides: all misses go to the GPU. Each copied expert is inserted into the layer's cache as it
    arrives, evicting the least recently used resident that the current layer does not use; when
    every slot holds an expert in use, the copy bypasses the cache (a scratch buffer). Hits are
    touched in expert-id order, then inserted misses in copy order (:func:`lru_retain`). Source: the
    per-layer LRU "eviction group" of mixtral-offloading (Eliseev & Mazur, 2023).
    """

    name = "lru"

    def setup(self, ctx):
        super().setup(ctx)
        self.stamp = np.full((ctx.n_layers, ctx.n_experts), -1, np.int64)  # recency per layer; -1: not cached
        self.clock = np.zeros((ctx.n_layers, 1), np.int64)  # each layer's last stamp

    def decide(self, view: LayerView) -> LayerDecision:
        j = view.layer
        row = view.resident_row(self.ctx.n_experts)
        keep = lru_retain(view.active, view.missed, row, view.capacity, self.stamp[j], self.clock[j])
        return LayerDecision(to_gpu=view.missed.tolist(), to_cpu=[], retain=set(keep.tolist()))

    def trim(self, layer, resident, capacity):
        """The ``capacity`` most recently used of ``resident``, then those with no stamp by lower id."""
        st = self.stamp[layer]
        ranked = sorted(resident, key=lambda e: (0, -st[e]) if st[e] >= 0 else (1, e))
        keep = set(ranked[:capacity])
        for e in np.flatnonzero(st >= 0).tolist():
            if e not in keep:
                st[e] = -1
        return keep
