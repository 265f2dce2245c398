"""The clairvoyant cache bound: Belady retention with bypass, handed the future explicitly."""

from __future__ import annotations

import numpy as np

from policies.base import ClairvoyantPolicy, LayerDecision, LayerView, PolicyError
from policies.dispatch import cooperative_dispatch, hardware_split
from policies.select import keep_top_by


class IdealPolicy(ClairvoyantPolicy):
    """Ideal cache bound (paper §5.1): maximise activated experts already resident at each layer.

    Decides retention with Belady's rule per MoE layer: after the layer, keep the ``capacity``
    experts (among residents and copied ones) whose next activation at this layer comes soonest;
    experts never used again are dropped (bypass). With ``dispatch: gpu`` every miss is copied,
    which makes it the optimal demand-miss count for any non-prefetching policy at the same
    per-layer capacity. With ``dispatch: coop`` misses are split like OLED-MoE's, using the
    clairvoyant reuse value ``1 / (forwards until next use)`` as priority, so that its TPOT is a
    bound for systems with CPU compensation. Not deployable: it reads a :class:`FutureOracle`.
    """

    name = "ideal"

    def __init__(self, dispatch: str = "coop", reuse_weight: float = 0.5, max_swaps: int = 4, max_shift: int = 1):
        if dispatch not in ("gpu", "coop"):
            raise PolicyError(f"ideal: dispatch must be 'gpu' or 'coop', got {dispatch!r}")
        self.dispatch = dispatch
        self.reuse_weight, self.max_swaps, self.max_shift = reuse_weight, max_swaps, max_shift

    def decide(self, view: LayerView) -> LayerDecision:
        j, f = view.layer, view.forward.index
        nx = self.oracle.next_uses(j, f).astype(np.float64)
        never = nx >= np.iinfo(np.int32).max
        missed = view.missed
        if self.dispatch == "coop" and len(missed):
            mt = view.missed_tokens.tolist()
            prio = np.where(never[missed], 0.0, 1.0 / (nx[missed] - f)).tolist()
            rho = hardware_split(self.ctx.costs, sum(mt) / len(mt))
            to_gpu, to_cpu = cooperative_dispatch(missed.tolist(), mt, prio, self.ctx.costs, rho, len(view.active),
                                                  self.reuse_weight, self.max_swaps, self.max_shift)
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
