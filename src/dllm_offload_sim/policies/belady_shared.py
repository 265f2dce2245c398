"""Clairvoyant retention over one pool of slots shared by every MoE layer (the paper's "same capacity")."""

from __future__ import annotations

import numpy as np

from dllm_offload_sim.policies.base import ClairvoyantPolicy, LayerDecision, LayerView
from dllm_offload_sim.policies.jit import kernel


@kernel
def _keep_soonest(held, j, next_after, next_from, slots):  # pragma: no cover (numba)
    """Keep in ``held`` [L, E] the ``slots`` held experts whose next use comes soonest in execution order (the next
    use of layers ``0..j`` from ``next_after``, of later layers from ``next_from``; ties: the lower layer, then the
    lower id); experts never used again are dropped."""
    L, E = held.shape
    never = np.iinfo(np.int32).max
    n = 0
    for l in range(L):
        for e in range(E):
            if held[l, e]:
                n += 1
    key = np.empty(n, np.int64)  # (next use, layer, expert) as one number: distinct, ordered as the tuple
    n = 0
    for l in range(L):
        src = next_after if l <= j else next_from
        for e in range(E):
            if held[l, e]:
                held[l, e] = False
                if src[l, e] < never:
                    key[n] = (np.int64(src[l, e]) * L + l) * E + e
                    n += 1
    key = key[:n]
    if n > slots:  # the keys are distinct: the `slots` smallest are those up to the slots-th smallest
        cut = np.partition(key, slots - 1)[slots - 1] if slots > 0 else -1
    else:
        cut = np.iinfo(np.int64).max
    for i in range(n):
        k = key[i]
        if k <= cut:
            held[(k // E) % L, k % E] = True


@kernel
def shared_belady_layer(
    held, j, resident_row, missed, next_after, next_from, slots
):  # pragma: no cover (numba)
    """Layer ``j`` decided over the pool ``held`` [L, E]: its residents (``resident_row``, a mask by expert) and its
    copied ``missed`` experts join the pool's other layers, and the pool keeps its ``slots`` soonest used
    (:func:`_keep_soonest`)."""
    held[j, :] = resident_row
    for e in missed:
        held[j, e] = True
    _keep_soonest(held, j, next_after, next_from, slots)


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
        j, f = view.layer, view.forward.index
        held = self.held
        # every miss is copied, then competes for the pool like the rest; the next use from here on, in execution
        # order: this and earlier layers' after this forward, later layers' from this forward on
        shared_belady_layer(
            held,
            j,
            view.resident_row(self.ctx.n_experts),
            view.missed,
            self.oracle.next_uses_all(f),
            self.oracle.next_uses_all(f - 1),
            self.ctx.total_slots,
        )
        self._caps = held.sum(1).astype(np.int64)
        return LayerDecision(
            to_gpu=view.missed.tolist(), to_cpu=[], retain=set(np.flatnonzero(held[j]).tolist())
        )

    def pool_decided(self, pool: np.ndarray) -> None:
        """A forward decided outside :meth:`decide` (compiled, ``sim.fused``) left the pool holding ``pool`` [L, E]:
        the policy's pool and capacities follow it."""
        self.held[:] = pool
        self._caps = pool.sum(1).astype(np.int64)

    def trim(self, layer, resident, capacity):
        return set(resident).intersection(np.flatnonzero(self.held[layer]).tolist())
