"""OLED-MoE (paper §4): confidence-guided retention, layer-adaptive sizing, cooperative dispatch."""

from __future__ import annotations

from itertools import chain

import numpy as np

from policies.base import LayerDecision, LayerView, OfflineKnowledge, Policy, PolicyError
from policies.dispatch import cooperative_dispatch, hardware_split
from policies.select import keep_top, keep_top_by, proportional_slots

PSI = {"linear": lambda c: c, "square": lambda c: c * c, "sqrt": np.sqrt}


class OLEDPolicy(Policy):
    """OLED-MoE and its ablation ladder (``priority``, ``layer_adapt``, ``coop`` switch each part).

    * Priority (§4.3): ``p_e = sum_t g_te * psi(c_t) / sum_e' sum_t g_te' * psi(c_t)`` over the
      tokens routed to ``e`` at this layer, with ``c_t`` the confidence from the previous forward's
      output (``default_confidence`` where there is none: a new block's first forward, prompt
      rows). Residents not activated now get priority 0 (stale). After the layer the top-``C_l``
      experts of residents plus copied ones stay. Without ``priority`` retention is by recency
      (the Naive-LRU baseline of the ladder).
    * LayerAdapt (§4.3): every ``adapt_interval`` forwards, ``C_l = C_total * w_l / sum w`` with
      ``w_l = a_l * u_l`` (exponentially smoothed activation ratio and cache utilisation,
      factor ``smoothing``), at least ``min_capacity_frac * Cache`` slots per layer, at most E.
    * Coop (§4.4): misses are split between GPU transfer and CPU execution by the hardware ratio
      rho and the two-stage priority-first, bounded-swap heuristic (:mod:`policies.dispatch`).
      Without ``coop`` every miss is copied to the GPU; with ``reuse_aware: false`` the split is
      load-only (heaviest misses to the GPU, no reuse term), the comparison of Fig. 15b.
    """

    name = "oled"

    def __init__(self, priority: bool = True, layer_adapt: bool = True, coop: bool = True, psi: str = "linear",
                 default_confidence: float = 1.0, adapt_interval: int = 5, smoothing: float = 0.5,
                 min_capacity_frac: float = 0.25, reuse_weight: float = 0.5, max_swaps: int = 4, max_shift: int = 1,
                 reuse_aware: bool = True):
        if psi not in PSI:
            raise PolicyError(f"oled: psi must be one of {sorted(PSI)}, got {psi!r}")
        if adapt_interval < 1:
            raise PolicyError(f"oled: adapt_interval must be >= 1, got {adapt_interval}")
        if not 0 < smoothing <= 1:
            raise PolicyError(f"oled: smoothing must be in (0, 1], got {smoothing}")
        self.use_priority, self.use_adapt, self.use_coop = priority, layer_adapt, coop
        self.psi = PSI[psi]
        self.default_confidence = float(default_confidence)
        self.adapt_interval, self.smoothing, self.min_capacity_frac = adapt_interval, smoothing, min_capacity_frac
        self.reuse_weight, self.max_swaps, self.max_shift = reuse_weight, max_swaps, max_shift
        self.reuse_aware = reuse_aware

    def setup(self, ctx):
        super().setup(ctx)
        L, E = ctx.n_layers, ctx.n_experts
        self.prio = [np.zeros(E) for _ in range(L)]  # current reuse priority per layer (one array each)
        self.last = np.full((L, E), -1, np.int64)  # recency, for the ladder's base and tie-breaks
        self.act_ratio = [None] * L  # smoothed activation ratio per layer (plain floats: updated per layer)
        self.util = [None] * L  # smoothed cache utilisation per layer
        self.forwards_seen = 0
        self.mean_tokens = float("nan")  # profiled tokens per missed expert (n-bar)
        self._tok_sum, self._tok_n = 0.0, 0
        self.row_psi = None
        self._rho_key, self._rho = None, 0.5  # hardware split for the last rounded n-bar

    def begin_batch(self, knowledge: OfflineKnowledge):
        if np.isfinite(knowledge.mean_tokens_per_active_expert):
            self.mean_tokens = float(knowledge.mean_tokens_per_active_expert)
        return None

    def begin_forward(self, fwd):
        c = np.asarray(fwd.prev_confidence, np.float32)
        c = np.where(np.isnan(c), np.float32(self.default_confidence), c)
        self.row_psi = self.psi(np.clip(c, 0.0, 1.0)).astype(np.float32)[:, None]
        if self.use_adapt and fwd.phase != 0:
            self.forwards_seen += 1
            if self.forwards_seen % self.adapt_interval == 0 and None not in self.act_ratio:
                w = np.asarray(self.act_ratio) * np.asarray(self.util)
                lo = max(1, int(self.min_capacity_frac * self.ctx.cache))
                self._caps = proportional_slots(w, self.ctx.total_slots, lo, self.ctx.n_experts)

    def decide(self, view: LayerView) -> LayerDecision:
        j, f = view.layer, view.forward.index
        # confidence-weighted gate mass per expert; dividing by the layer total does not change the
        # ranking, so it is applied only where priorities are weighed against costs (dispatch)
        p = np.bincount(view.ids.ravel(), weights=(view.weights * self.row_psi).ravel(), minlength=self.ctx.n_experts)
        self.prio[j] = p  # stale residents (not activated now) drop to 0
        active, missed = view.active, view.missed
        self.last[j, active] = f
        if self.use_adapt:
            a = len(active) / self.ctx.n_experts
            u = (len(active) - len(missed)) / view.capacity if view.capacity else 0.0
            s = self.smoothing
            ar, ut = self.act_ratio, self.util
            ar[j] = a if ar[j] is None else (1 - s) * ar[j] + s * a
            ut[j] = u if ut[j] is None else (1 - s) * ut[j] + s * u
        if self.use_coop and len(missed):
            mt = view.missed_tokens.tolist()
            self._tok_sum += sum(mt)
            self._tok_n += len(mt)
            n_bar = self.mean_tokens if self.mean_tokens == self.mean_tokens else self._tok_sum / self._tok_n
            key = max(1, int(round(n_bar)))  # hardware_split reads the rounded token count only
            if key != self._rho_key:
                self._rho_key, self._rho = key, hardware_split(self.ctx.costs, n_bar)
            rho = self._rho
            total = float(np.add.reduce(p)) or 1.0  # (p.sum() without its Python wrapper)
            if self.reuse_aware:
                to_gpu, to_cpu = cooperative_dispatch(missed.tolist(), mt, (p[missed] / total).tolist(), self.ctx.costs,
                                                      rho, len(active), self.reuse_weight, self.max_swaps, self.max_shift)
            else:  # load-only dispatch (Fig. 15b): the heaviest misses go to the GPU, priority ignored
                to_gpu, to_cpu = cooperative_dispatch(missed.tolist(), mt, [float(t) for t in mt], self.ctx.costs,
                                                      rho, len(active), 0.0, self.max_swaps, self.max_shift)
        else:
            to_gpu, to_cpu = missed.tolist(), []
        res = view.resident
        cap = view.capacity
        if len(res) + len(to_gpu) <= cap:
            return LayerDecision(to_gpu=to_gpu, to_cpu=to_cpu, retain=res.union(to_gpu))
        if self.use_priority:
            # Priorities are >= 0 and stale residents have 0 and an older last use, so the ranking by
            # (priority, last use, -id) puts the active experts that stay on the GPU (hits and copies)
            # first, by (priority, -id): one stable sort of ``active`` (sorted by id), CPU experts last
            key = -p[active]
            if to_cpu:
                key[np.searchsorted(active, to_cpu)] = np.inf
            n_on = len(active) - len(to_cpu)
            retain = set(active[np.argsort(key, kind="stable")[:min(cap, n_on)]].tolist())
            if n_on < cap:  # room left: the most recently used stale residents
                stale = np.fromiter(res.difference(active.tolist()), np.int64)
                retain.update(keep_top_by(stale, cap - n_on, self.last[j][stale]))
            return LayerDecision(to_gpu=to_gpu, to_cpu=to_cpu, retain=retain)
        cands = np.fromiter(chain(res, to_gpu), np.int64, len(res) + len(to_gpu))
        return LayerDecision(to_gpu=to_gpu, to_cpu=to_cpu, retain=keep_top_by(cands, cap, self.last[j][cands]))

    def trim(self, layer, resident, capacity):
        p, last = self.prio[layer], self.last[layer]
        if self.use_priority:
            return keep_top(resident, lambda e: (p[e], last[e]), capacity)
        return keep_top(resident, lambda e: (last[e], 0), capacity)
