"""Clairvoyant retention over one pool of slots shared by every MoE layer (the paper's "same capacity")."""

from __future__ import annotations

import numpy as np

from policies.base import ClairvoyantPolicy, LayerDecision, LayerView


class SharedBeladyPolicy(ClairvoyantPolicy):
    """Belady retention with bypass over a pool of ``Cache x layers`` slots that every MoE layer draws from:
    every miss is copied; after each layer the pool keeps, among all residents of every layer and the layer's
    copies, the experts whose next activation comes soonest in execution order (forward, then layer); experts
    never used again are dropped. So a layer may hold more than ``Cache`` experts while others hold fewer. Its
    misses and copies bound every policy that copies every miss within the same total slots, layer-adaptive
    ones (OLED's LayerAdapt) included. Not deployable: it reads a :class:`FutureOracle`.
    """

    name = "belady_shared"
    shares_slots = True  # the driver re-reads capacities after each decision (they move between layers)

    def setup(self, ctx):
        super().setup(ctx)
        self.held = [set() for _ in range(ctx.n_layers)]  # what the pool holds per layer after this policy's decisions

    def decide(self, view: LayerView) -> LayerDecision:
        j, f, L = view.layer, view.forward.index, self.ctx.n_layers
        never = np.iinfo(np.int32).max
        self.held[j] = set(view.resident)
        layers, experts, keys = [], [], []
        for jj in range(L):
            mine = self.held[jj] | set(view.missed.tolist()) if jj == j else self.held[jj]
            if not mine:
                continue
            e = np.fromiter(mine, np.int64, len(mine))
            # the next use from here on: this layer's after this forward; earlier layers' in the next forward;
            # later layers' from this forward on
            nx = self.oracle.next_uses(jj, f if jj <= j else f - 1)[e].astype(np.int64)
            keep = nx < never
            layers.append(np.full(int(keep.sum()), jj))
            experts.append(e[keep])
            keys.append(nx[keep] * L + jj)
        lay, exp, key = (np.concatenate(a) if a else np.zeros(0, np.int64) for a in (layers, experts, keys))
        order = np.lexsort((exp, lay, key))[: self.ctx.total_slots]  # soonest next use first; ties: layer, id
        held = [set() for _ in range(L)]
        for jj, e in zip(lay[order].tolist(), exp[order].tolist()):
            held[jj].add(e)
        self.held = held
        self._caps = np.array([len(h) for h in held], np.int64)
        return LayerDecision(to_gpu=view.missed.tolist(), to_cpu=[], retain=set(held[j]))

    def trim(self, layer, resident, capacity):
        return set(resident) & self.held[layer]
