"""Clairvoyant retention: Belady's rule with bypass, per MoE layer; handed the future explicitly."""

from __future__ import annotations

import numpy as np

from dllm_offload_sim.policies.base import ClairvoyantPolicy, LayerDecision, LayerView, PolicyError
from dllm_offload_sim.policies.dispatch import cooperative_dispatch, hardware_split
from dllm_offload_sim.policies.select import keep_top_by


class BeladyPolicy(ClairvoyantPolicy):
    """Per-layer Belady retention with bypass: after each MoE layer keep the ``capacity`` experts (among
    residents and copied ones) whose next activation at this layer comes soonest; experts never used again
    are dropped.

    ``dispatch: gpu`` (``belady``): every miss is copied, so its misses and copies are the fewest any
    non-prefetching policy can have at the same per-layer capacity: a bound on hit rate and copies (and on
    the TPOT of policies that run every expert on the GPU).
    ``dispatch: coop`` (``clairvoyant_coop``): misses split like OLED-MoE's, with the clairvoyant reuse value
    ``1 / (forwards until next use)``, normalised over the layer's active experts as OLED's priorities are, as
    the priority. A strong clairvoyant heuristic for systems with CPU compensation, **not** a bound: the split
    is a heuristic, so a deployable policy can beat it. Not deployable: it reads a :class:`FutureOracle`.
    """

    def __init__(self, dispatch: str = "gpu", reuse_weight: float = 0.5, max_swaps: int = 4, max_shift: int = 1):
        if dispatch not in ("gpu", "coop"):
            raise PolicyError(f"belady: dispatch must be 'gpu' or 'coop', got {dispatch!r}")
        self.dispatch = dispatch
        self.name = "belady" if dispatch == "gpu" else "clairvoyant_coop"
        self.reuse_weight, self.max_swaps, self.max_shift = reuse_weight, max_swaps, max_shift

    def decide(self, view: LayerView) -> LayerDecision:
        j, f = view.layer, view.forward.index
        nx = self.oracle.next_uses(j, f).astype(np.float64)
        never = nx >= np.iinfo(np.int32).max
        missed = view.missed
        if self.dispatch == "coop" and len(missed):
            mt = view.missed_tokens.tolist()
            reuse = np.where(never, 0.0, 1.0 / np.maximum(nx - f, 1.0))
            total = float(reuse[view.active].sum()) or 1.0
            prio = (reuse[missed] / total).tolist()
            rho = hardware_split(self.ctx.costs, sum(mt) / len(mt))
            to_gpu, to_cpu = cooperative_dispatch(missed.tolist(), mt, prio, self.ctx.costs, rho, len(view.active),
                                                  view.ids.shape[0], self.reuse_weight, self.max_swaps,
                                                  self.max_shift)
        else:
            to_gpu, to_cpu = missed.tolist(), []
        cands = np.concatenate([np.fromiter(view.resident, np.int64, len(view.resident)),
                                np.asarray(to_gpu, np.int64)])
        cands = cands[~never[cands]]
        retain = keep_top_by(cands, view.capacity, -nx[cands])
        return LayerDecision(to_gpu=to_gpu, to_cpu=to_cpu, retain=retain)

    def trim(self, layer, resident, capacity):
        nx = self.oracle.next_uses(layer, self._forward).astype(np.float64)
        cands = np.asarray(sorted(resident), np.int64)
        return keep_top_by(cands, capacity, -nx[cands])

    def begin_forward(self, fwd):
        self._forward = fwd.index - 1
