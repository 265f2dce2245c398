"""TIDE: periodic top-B placement refresh for MoE dLLMs, CPU execution in between."""

from __future__ import annotations

from dllm_offload_sim.policies.base import LayerDecision, LayerView, Policy, PolicyError


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
        hits = dict(zip(view.active.tolist(), view.tokens.tolist()))
        target = sorted(hits, key=lambda e: (-hits[e], e))[: view.capacity]
        promote = [e for e in target if e not in view.resident]
        demote = sorted((e for e in view.resident if e not in target), key=lambda e: (hits.get(e, 0), e))
        free = view.capacity - len(view.resident)
        n = min(len(promote), max(free, 0) + len(demote))
        promote = promote[:n]
        n_demote = max(0, n - max(free, 0))
        retain = (set(view.resident) - set(demote[:n_demote])) | set(promote)
        pset = set(promote)
        return LayerDecision(to_gpu=promote, to_cpu=[e for e in missed if e not in pset], retain=retain)
