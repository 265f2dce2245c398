"""Clairvoyant retention over one pool of slots shared by every MoE layer (the paper's "same capacity")."""

from __future__ import annotations

import numpy as np

from dllm_offload_sim.policies.base import ClairvoyantPolicy, LayerDecision, LayerView


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
        self.held = np.zeros((ctx.n_layers, ctx.n_experts), bool)  # what the pool holds after its decisions

    def decide(self, view: LayerView) -> LayerDecision:
        j, f, L = view.layer, view.forward.index, self.ctx.n_layers
        held = self.held
        held[j] = False
        held[j, np.fromiter(view.resident, np.int64, len(view.resident))] = True
        held[j, view.missed] = True  # every miss is copied, then competes for the pool like the rest
        # the next use from here on, in execution order: this and earlier layers' after this forward, later
        # layers' from this forward on
        nxt = np.where(
            np.arange(L)[:, None] <= j, self.oracle.next_uses_all(f), self.oracle.next_uses_all(f - 1)
        ).astype(np.int64)
        cand = held & (nxt < np.iinfo(np.int32).max)  # never used again: dropped (bypass)
        lay, exp = np.nonzero(cand)
        key = nxt[lay, exp] * L + lay
        if len(key) > self.ctx.total_slots:
            order = np.lexsort((exp, key))[
                : self.ctx.total_slots
            ]  # soonest next use first; ties: layer, then id
            lay, exp = lay[order], exp[order]
        held[:] = False
        held[lay, exp] = True
        self._caps = held.sum(1).astype(np.int64)
        return LayerDecision(
            to_gpu=view.missed.tolist(), to_cpu=[], retain=set(np.flatnonzero(held[j]).tolist())
        )

    def trim(self, layer, resident, capacity):
        return {e for e in resident if self.held[layer, e]}
