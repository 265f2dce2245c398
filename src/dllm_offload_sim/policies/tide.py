"""TIDE: periodic top-B placement refresh for MoE dLLMs, CPU execution in between."""

from __future__ import annotations

import numpy as np

from dllm_offload_sim.policies.base import LayerDecision, LayerView, Policy, PolicyError
from dllm_offload_sim.policies.jit import kernel, stable_argsort
from dllm_offload_sim.policies.select import resident_without


@kernel
def tide_refresh(active, tokens, row, cap):  # pragma: no cover (numba)
    """One layer's refresh: the ``cap`` experts of ``active`` (ascending ids) with the most routed ``tokens`` (ties to
    the lower id) are the target; returns (the targets that ``row``, the residency, lacks, promoted in target order,
    and the residents demoted to make room for them, fewest tokens first, then lower id). A promotion takes a free
    slot first, then demotes one resident outside the target; promotions stop when neither is left."""
    n_act = active.shape[0]
    order = stable_argsort(-tokens.astype(np.float64))
    n_target = min(cap, n_act)
    in_target = np.zeros(row.shape[0], np.bool_)
    hits = np.zeros(row.shape[0], np.int64)
    for i in range(n_act):
        hits[active[i]] = tokens[i]
    promote = np.empty(n_target, np.int64)
    n_promote = 0
    for i in range(n_target):
        e = active[order[i]]
        in_target[e] = True
        if not row[e]:
            promote[n_promote] = e
            n_promote += 1
    n_res = 0
    for e in range(row.shape[0]):
        n_res += row[e]
    demote = resident_without(row, in_target)
    n_cands = demote.shape[0]
    demote = demote[stable_argsort(hits[demote].astype(np.float64))]
    free = max(cap - n_res, 0)
    n = min(n_promote, free + n_cands)
    return promote[:n], demote[: max(0, n - free)]


class TIDEPolicy(Policy):
    """Refresh each layer's GPU set every ``jump_steps`` decode forwards, run other misses on the CPU.

    Decides: on a refresh forward (every forward of the first generated block, then every
    ``jump_steps`` decode forwards) each layer counts token hits per expert in this forward and
    targets the ``Cache`` experts with the most hits (hits > 0). Missing targets are promoted: copied
    now, computed on the GPU and kept. Each promotion into a full layer demotes one resident not in
    the target, fewest hits first ("paired" swaps; surplus residents stay). Every other miss, and all
    misses between refreshes, run on the CPU. Source: ims-kdks/TIDE modeling_llada2_moe.py
    (baselines.md §7); the promotion copies are put on this forward's critical path.
    """

    name = "tide"

    def __init__(self, jump_steps: int = 4, refresh_first_block: bool = True):
        if jump_steps < 1:
            raise PolicyError(f"tide: jump_steps must be >= 1, got {jump_steps}")
        self.jump_steps, self.refresh_first_block = jump_steps, refresh_first_block

    def setup(self, ctx):
        super().setup(ctx)
        self.decode_step = -1
        self.blocks_started = 0
        self.refresh = True

    def begin_batch(self, knowledge):
        self.decode_step, self.blocks_started = -1, 0
        return None

    def begin_forward(self, fwd):
        if fwd.phase == 0:  # prefill: no refresh
            self.refresh = False
            return
        self.decode_step += 1
        if fwd.block_start:
            self.blocks_started += 1
        first_block = self.blocks_started <= 1
        self.refresh = (self.refresh_first_block and first_block) or self.decode_step % self.jump_steps == 0

    def decide(self, view: LayerView) -> LayerDecision:
        missed = view.missed.tolist()
        if not self.refresh:
            return LayerDecision(to_gpu=[], to_cpu=missed, retain=view.resident)
        promote, demote = tide_refresh(
            view.active, view.tokens, view.resident_row(self.ctx.n_experts), view.capacity
        )
        promote = promote.tolist()
        retain = (set(view.resident) - set(demote.tolist())) | set(promote)
        pset = set(promote)
        return LayerDecision(to_gpu=promote, to_cpu=[e for e in missed if e not in pset], retain=retain)
