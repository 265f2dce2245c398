"""Fused forwards: a whole forward's MoE layers decided in one compiled call, for policies with a layer kernel.

The compiled closed form (:mod:`sim.closed_form`) times a forward's layers at once once they are decided; for a
policy whose decision is itself a compiled kernel, the deciding can be one compiled call too: each layer's routing
read, its misses found against the residency, the policy's kernel run, the residency set to what it retains, and
the layer's counters (hits, copies, the copies an earlier forward made that this one hits) written for the engine
to account. The engine (:meth:`sim.engine.Simulation._forwards_closed`) uses a fused forward where the policy has
one (:func:`fused_forward_of`) and the policy's own ``decide`` otherwise; ``tests/test_closed_form.py`` holds the two
to the bit.

A fused policy decides as its ``decide`` does, through the same kernel: Naive-LRU (``naive_lru_retain``).
"""

from __future__ import annotations

import numpy as np

from dllm_offload_sim.policies.jit import kernel
from dllm_offload_sim.policies.naive_lru import NaiveLRUPolicy, naive_lru_retain

# the columns of a fused forward's per-layer output: activated experts, hits, the hits' routed pairs, experts
# copied on demand, their routed pairs, and hits that the previous decode forward copied into the layer
N_ACTIVE, N_HITS, HIT_PAIRS, N_COPIED, COPIED_PAIRS, EFFECTIVE = range(6)
LAYER_COLUMNS = 6


@kernel
def naive_lru_forward(
    forward, decode, es, tok, cut, mask, caps, last, prev, copied_in, out
):  # pragma: no cover (numba)
    """Forward ``forward``'s MoE layers under Naive-LRU: layer ``j`` activates ``es[cut[j]:cut[j + 1]]`` with
    ``tok[...]`` routed pairs each; ``mask`` [L, E] (the residency) becomes what each layer retains, ``last`` and
    ``prev`` are the policy's state, and ``copied_in`` [L, E] the last decode forward that copied each expert into each
    layer (-1: none), updated in a decode forward. Writes each layer's counters into ``out`` [L, LAYER_COLUMNS]."""
    for j in range(caps.shape[0]):
        c0, c1 = cut[j], cut[j + 1]
        active = es[c0:c1]
        row = mask[j]
        n_miss = 0
        for i in range(c1 - c0):
            n_miss += not row[active[i]]
        missed = np.empty(n_miss, np.int64)
        k = hits = hit_pairs = copied_pairs = effective = 0
        for i in range(c1 - c0):
            e = active[i]
            if row[e]:
                hits += 1
                hit_pairs += tok[c0 + i]
                effective += copied_in[j, e] == forward - 1
            else:
                missed[k] = e
                k += 1
                copied_pairs += tok[c0 + i]
        keep = naive_lru_retain(active, missed, row, caps[j], last[j], prev[j], forward)
        row[:] = False
        for e in keep:
            row[e] = True
        if decode:
            for e in missed:
                copied_in[j, e] = forward
        out[j, N_ACTIVE] = c1 - c0
        out[j, N_HITS] = hits
        out[j, HIT_PAIRS] = hit_pairs
        out[j, N_COPIED] = n_miss
        out[j, COPIED_PAIRS] = copied_pairs
        out[j, EFFECTIVE] = effective


class FusedNaiveLRU:
    """Naive-LRU's forwards fused (:func:`naive_lru_forward`) over its policy object's state."""

    def __init__(self, policy: NaiveLRUPolicy, n_layers: int, n_experts: int):
        self.policy = policy
        self.copied_in = np.full((n_layers, n_experts), -1, np.int64)
        self.out = np.zeros((n_layers, LAYER_COLUMNS), np.int64)

    def forward(self, f, decode: bool, mask: np.ndarray, caps: np.ndarray) -> np.ndarray:
        """Decide forward ``f``'s MoE layers (``mask`` updated in place); returns their counters."""
        es, tok, cut = f.routing_arrays()
        naive_lru_forward(
            f.index,
            decode,
            es,
            tok,
            cut,
            mask,
            caps,
            self.policy.last,
            self.policy.prev,
            self.copied_in,
            self.out,
        )
        return self.out


def fused_forward_of(policy, n_layers: int, n_experts: int):
    """The fused forwards of ``policy``, or None where it has none (a subclass may decide otherwise: only the class
    itself qualifies)."""
    if type(policy) is NaiveLRUPolicy:
        return FusedNaiveLRU(policy, n_layers, n_experts)
    return None
