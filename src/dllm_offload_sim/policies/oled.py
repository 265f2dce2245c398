"""OLED-MoE (paper §4): confidence-guided retention, layer-adaptive sizing, cooperative dispatch."""

from __future__ import annotations

import numpy as np

from dllm_offload_sim.policies.base import LayerDecision, LayerView, OfflineKnowledge, Policy, PolicyError
from dllm_offload_sim.policies.dispatch import rounded_tokens, split_misses, split_ratio
from dllm_offload_sim.policies.jit import kernel, stable_argsort
from dllm_offload_sim.policies.select import (
    keep_top_by,
    proportional_slots,
    resident_and,
    resident_without,
    top_of,
)
from dllm_offload_sim.traces.schema import PREFILL

PSI = ("linear", "square", "sqrt")  # psi(c): c, c * c, sqrt(c); a kernel's ``mode`` is the index here


# What oled_layer needs of the policy's settings and the run's costs, fixed for a run: one typed record
# (a numpy structured scalar, read by field name in the kernel; a single argument costs least per call)
OLED_CONSTANTS = np.dtype(
    [
        ("h2d_s", np.float64),  # copying one expert to the GPU
        ("cpu_workers", np.int64),
        ("reuse_aware", np.bool_),  # the dispatch weighs reuse priority (False: load only, Fig. 15b)
        ("reuse_weight", np.float64),  # lambda of the dispatch objective
        ("max_swaps", np.int64),
        ("max_shift", np.int64),
        ("by_priority", np.bool_),  # retention by priority (False: by recency)
        ("adapt", np.bool_),  # layer-adaptive capacities (the smoothed statistics are kept)
        ("smoothing", np.float64),
        ("n_experts", np.int64),
        (
            "stale_by_recency",
            np.bool_,
        ),  # stale residents kept most recently used first (False: lower id first)
        ("window", np.bool_),  # a_l, u_l summed over the forwards since the last reallocation (False: an EMA)
        ("rho_paper", np.bool_),  # rho from n-bar x the one-token CPU time, n-bar over this run's misses
    ]
)

# fields of OLED_CONSTANTS that may be left out: the project's side of each paper switch
CONSTANT_DEFAULTS = {"stale_by_recency": True, "window": False, "rho_paper": False}


def oled_constants(**fields) -> np.ndarray:
    """An :data:`OLED_CONSTANTS` record (a one-element array) with every field given by name (those of
    :data:`CONSTANT_DEFAULTS` may be left out)."""
    fields = {**CONSTANT_DEFAULTS, **fields}
    missing = set(OLED_CONSTANTS.names) - set(fields)
    if missing:
        raise TypeError(f"oled_constants: missing {sorted(missing)}")
    k = np.zeros(1, OLED_CONSTANTS)
    for name, v in fields.items():
        k[name] = v
    return k


# The eight places where the paper (§4.3-4.4) leaves a gap or the project reads it otherwise: the switch (an
# OLEDPolicy argument), the project's value, the paper-literal value. conf/policy/oled_paper.yaml sets every one to
# the paper's side; docs/policies.md gives the reasons.
PAPER_SWITCHES = {
    "confidence": ("previous", "current"),
    "stale_order": ("recency", "id"),
    "statistics": ("ema", "window"),
    "prefill_in_stats": (True, False),
    "min_capacity_frac": (0.25, 0.0),
    "resize_at": ("forward_start", "layer_end"),
    "rho": ("curve", "paper"),
    "max_shift": (1, 0),
}


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

    The paper switches (:data:`PAPER_SWITCHES`; the project's reading first):

    * ``confidence``: ``previous``, the confidence forward i-1 produced (what a runtime has when layer l of forward
      i runs), or ``current``, the paper's ``c_t^i``, the confidence forward i itself produces, known only after its
      last layer: a look-ahead by one forward, which a live decode cannot run (``reads_own_confidence``).
    * ``stale_order``: stale residents kept in the room left by ``recency`` or by ``id`` (all have priority 0).
    * ``statistics``: ``a_l`` and ``u_l`` as an EMA with factor ``smoothing`` (``ema``), or their means over the
      forwards since the last reallocation (``window``).
    * ``prefill_in_stats``: prefill forwards enter ``a_l`` and ``u_l`` (the paper: denoising iterations).
    * ``min_capacity_frac``: the floor of a layer's capacity, a fraction of Cache (the paper: none; 1 slot stays).
    * ``resize_at``: a reallocated capacity takes effect at the next forward's start, where a shrunk layer is
      trimmed before it runs (``forward_start``), or a shrunk layer keeps its experts until it has run, then retains
      within its new capacity, and a grown one gains its slots from the next forward (``layer_end``, the paper's
      "enforced ... after layer execution").
    * ``rho``: the CPU cost of an average miss as the profiled CPU curve at round(n-bar), n-bar the offline tokens
      per active expert (``curve``), or the paper's ``n-bar * tau_CPU``: n-bar the tokens per missed expert (this
      run's running mean) times the one-token CPU time (``paper``).
    * ``max_shift``: how far the swaps may move the GPU set's size from ``round(rho * |M|)`` (the paper: swaps
      improve "the same transfer budget", 0).
    """

    name = "oled"

    def __init__(
        self,
        priority: bool = True,
        layer_adapt: bool = True,
        coop: bool = True,
        psi: str = "linear",
        default_confidence: float = 1.0,
        adapt_interval: int = 5,
        smoothing: float = 0.5,
        min_capacity_frac: float = 0.25,
        reuse_weight: float = 0.5,
        max_swaps: int = 4,
        max_shift: int = 1,
        reuse_aware: bool = True,
        confidence: str = "previous",
        stale_order: str = "recency",
        statistics: str = "ema",
        prefill_in_stats: bool = True,
        resize_at: str = "forward_start",
        rho: str = "curve",
    ):
        if psi not in PSI:
            raise PolicyError(f"oled: psi must be one of {sorted(PSI)}, got {psi!r}")
        for field, value in (
            ("confidence", confidence),
            ("stale_order", stale_order),
            ("statistics", statistics),
            ("resize_at", resize_at),
            ("rho", rho),
        ):
            if value not in PAPER_SWITCHES[field]:
                raise PolicyError(
                    f"oled: {field} must be one of {list(PAPER_SWITCHES[field])}, got {value!r}"
                )
        if not 0 <= min_capacity_frac <= 1:
            raise PolicyError(f"oled: min_capacity_frac must be in [0, 1], got {min_capacity_frac}")
        if max_shift < 0 or max_swaps < 0:
            raise PolicyError(f"oled: max_swaps and max_shift must be >= 0, got {max_swaps} and {max_shift}")
        if adapt_interval < 1:
            raise PolicyError(f"oled: adapt_interval must be >= 1, got {adapt_interval}")
        if not 0 < smoothing <= 1:
            raise PolicyError(f"oled: smoothing must be in (0, 1], got {smoothing}")
        self.use_priority, self.use_adapt, self.use_coop = priority, layer_adapt, coop
        self.psi_mode = PSI.index(psi)
        self.default_confidence = float(default_confidence)
        self.adapt_interval, self.smoothing, self.min_capacity_frac = (
            adapt_interval,
            smoothing,
            min_capacity_frac,
        )
        self.reuse_weight, self.max_swaps, self.max_shift = reuse_weight, max_swaps, max_shift
        self.reuse_aware = reuse_aware
        self.reads_own_confidence = confidence == "current"  # the driver hands this forward's own confidence
        self.stale_order, self.window, self.prefill_in_stats = (
            stale_order,
            statistics == "window",
            bool(prefill_in_stats),
        )
        self.resize_at_layer_end, self.rho = resize_at == "layer_end", rho

    def setup(self, ctx):
        super().setup(ctx)
        L, E = ctx.n_layers, ctx.n_experts
        self.prio = np.zeros((L, E))  # current reuse priority per layer (rows rewritten by oled_layer)
        self.last = np.full((L, E), -1, np.int64)  # recency, for the ladder's base and tie-breaks
        # per layer: the smoothed activation ratio and utilisation (NaN: none yet), or with ``statistics: window``
        # their sums since the last reallocation and (row 2) how many forwards were summed
        self.stats = np.zeros((3, L)) if self.window else np.full((3, L), np.nan)
        self.forwards_seen = 0
        self._next_caps = None  # with resize_at: layer_end, the capacities the layers shrink to as they run
        # n-bar, the tokens per missed expert the hardware split reads: [sum, count] of this run's missed experts'
        # tokens, then the profiled value (NaN: none, the running mean is used)
        self.n_bar = np.array([0.0, 0.0, np.nan])
        self.row_psi = None
        self._arrays_n, self._arrays = -1, None  # ctx.costs.cost_arrays for up to _arrays_n routed pairs
        self.constants = oled_constants(
            h2d_s=ctx.costs.expert_h2d_s,
            cpu_workers=ctx.costs.cpu_workers,
            reuse_aware=self.reuse_aware,
            reuse_weight=self.reuse_weight,
            max_swaps=self.max_swaps,
            max_shift=self.max_shift,
            by_priority=self.use_priority,
            adapt=self.use_adapt,
            smoothing=self.smoothing,
            n_experts=E,
            stale_by_recency=self.stale_order == "recency",
            window=self.window,
            rho_paper=self.rho == "paper",
        )
        self.constants_no_stats = self.constants.copy()  # prefill forwards that do not enter the statistics
        self.constants_no_stats["adapt"] = False

    def begin_batch(self, knowledge: OfflineKnowledge):
        if self.rho == "paper":  # n-bar is the running mean of this run's missed experts' tokens
            return None
        if np.isfinite(knowledge.mean_tokens_per_active_expert):
            self.n_bar[2] = float(knowledge.mean_tokens_per_active_expert)
            need = int(self.n_bar[2]) + 2  # the kernel looks the split up at the rounded n-bar
            if need > self._arrays_n:
                self._arrays_n, self._arrays = need, self.ctx.costs.cost_arrays(need)
        return None

    def begin_forward(self, fwd):
        conf = fwd.own_confidence if self.reads_own_confidence else fwd.prev_confidence
        if conf is None:
            raise PolicyError(
                "oled: confidence: current needs the forward's own confidence, which this back-end "
                "does not hand (a live decode has it only after the forward's last layer)"
            )
        self.row_psi = psi_row(
            np.asarray(conf, np.float32), np.float32(self.default_confidence), self.psi_mode
        )
        self.stats_now = self.prefill_in_stats or fwd.phase != PREFILL
        if (
            self._next_caps is not None
        ):  # the layers shrank as they ran last forward; every layer takes its new size
            self._caps, self._next_caps = self._next_caps, None
        if self.use_adapt and fwd.phase != PREFILL:
            self.forwards_seen += 1
            if self.forwards_seen % self.adapt_interval == 0:
                w = self._layer_weights()
                if w is not None:
                    lo = max(1, int(self.min_capacity_frac * self.ctx.cache))
                    caps = proportional_slots(w, self.ctx.total_slots, lo, self.ctx.n_experts)
                    if self.resize_at_layer_end:
                        self._next_caps = caps
                    else:
                        self._caps = caps

    def _layer_weights(self):
        """``w_l = a_l * u_l`` from the statistics, or None while some layer has none (a window's sums restart)."""
        s = self.stats
        if self.window:
            if (s[2] == 0).any():
                return None
            w = (s[0] / s[2]) * (s[1] / s[2])
            s[:] = 0.0
            return w
        return None if np.isnan(s[:2]).any() else s[0] * s[1]

    def layer_inputs(self, n_pairs: int) -> tuple:
        """What :func:`oled_layer` reads beside a layer's routing and the policy's state, for a layer of ``n_pairs``
        routed (token, expert) pairs in the current forward: the CPU seconds and the dispatch seconds by token count
        (covering every count up to ``n_pairs``) and the forward's constants record."""
        if n_pairs > self._arrays_n:  # CPU cost lookups must cover every token count of the layer
            self._arrays_n, self._arrays = n_pairs, self.ctx.costs.cost_arrays(n_pairs)
        return self._arrays[0], self._arrays[1], self.constants if self.stats_now else self.constants_no_stats

    def layer_capacity(self, j: int, cap: int) -> int:
        """Layer ``j``'s slots to retain within, of its ``cap``: with ``resize_at: layer_end`` a shrinking layer
        retains within its next size."""
        return cap if self._next_caps is None else min(cap, int(self._next_caps[j]))

    def decide(self, view: LayerView) -> LayerDecision:
        j, active, missed = view.layer, view.active, view.missed
        coop = self.use_coop and len(missed) > 0
        cpu_s, dispatch_s, constants = self.layer_inputs(view.ids.size)
        res, cap = view.resident, self.layer_capacity(j, view.capacity)
        mask = view.resident_row(self.ctx.n_experts)
        out, n_gpu = oled_layer(
            j,
            view.ids,
            view.weights,
            self.row_psi,
            active,
            missed,
            view.missed_tokens,
            self.prio,
            self.last,
            self.stats,
            view.forward.index,
            cap,
            len(res),
            mask,
            coop,
            self.n_bar,
            cpu_s,
            dispatch_s,
            constants,
        )
        m = len(missed)
        ids = out.tolist()
        to_gpu, to_cpu = ids[:n_gpu], ids[n_gpu:m]
        if len(res) + n_gpu <= cap:
            return LayerDecision(to_gpu=to_gpu, to_cpu=to_cpu, retain=res.union(to_gpu))
        if (
            self.use_priority
        ):  # the kernel's retained (a frozenset: the engine keeps it as the residency, no copy)
            return LayerDecision(to_gpu=to_gpu, to_cpu=to_cpu, retain=frozenset(ids[m:]))
        retain = ladder_retain(mask, out[:n_gpu], cap, self.last[j])
        return LayerDecision(to_gpu=to_gpu, to_cpu=to_cpu, retain=frozenset(retain.tolist()))

    def trim(self, layer, resident, capacity):
        cands = np.fromiter(resident, np.int64, len(resident))
        if self.use_priority and self.stale_order == "id":  # by priority alone, ties to the lower id
            return keep_top_by(cands, capacity, self.prio[layer][cands])
        if self.use_priority:  # by (priority, last use), ties to the lower id
            return keep_top_by(cands, capacity, self.prio[layer][cands], self.last[layer][cands])
        return keep_top_by(cands, capacity, self.last[layer][cands])


@kernel
def ladder_retain(row, copied, cap, last):  # pragma: no cover (numba)
    """The ladder base's retention in a layer that overflows: the ``cap`` most recently used (``last`` by expert) of
    its residents (``row``, a mask by expert) and the experts it ``copied``, ties to the lower id."""
    cands = resident_and(row, copied)
    key = last[cands]
    return top_of(cands, cap, key, key)


@kernel
def psi_row(confidence, default, mode):
    """``psi(clip(c, 0, 1))`` per row of ``confidence`` (float32; ``default`` where NaN), in float32; ``mode`` indexes
    :data:`PSI`."""
    out = np.empty(confidence.shape[0], np.float32)
    for i in range(confidence.shape[0]):
        c = confidence[i]
        if c != c:
            c = default
        if c < 0:
            c = np.float32(0.0)
        elif c > 1:
            c = np.float32(1.0)
        if mode == 1:
            c = c * c
        elif mode == 2:
            c = np.sqrt(c)
        out[i] = c
    return out


@kernel
def oled_layer(
    j,
    ids,
    weights,
    psi,
    active,
    missed,
    missed_tokens,
    prio,
    last,
    stats,
    forward,
    cap,
    n_resident,
    resident,
    coop,
    n_bar,
    cpu_s,
    dispatch_s,
    constants,
):
    """MoE layer ``j``'s arithmetic, on the policy's state rows ``prio[j]`` (priorities), ``last[j]`` (last
    use of each expert) and ``stats[:, j]`` (smoothed activation ratio and utilisation), with its
    :data:`OLED_CONSTANTS` record ``constants``: the GPU/CPU split of ``missed`` (every miss to the GPU without
    ``coop``) and, when the layer overflows and retention is by priority, the experts that stay: the active ones on
    the GPU (the best ``cap`` by priority, ties to the lower id, best first; all of them, in id order, where they fit),
    then, while slots are left, the stale residents (``resident``, a bool row, but not active) most recently used
    first, ties to the lower id.
    Returns one array, [to_gpu, to_cpu, retained], and the length of to_gpu (every part in ascending id order
    but the retained). ``cpu_s`` / ``dispatch_s``: CPU seconds by token count. ``n_bar``: the tokens per missed expert
    the hardware split reads (:func:`~dllm_offload_sim.policies.dispatch.hardware_split`): ``n_bar[2]`` where profiled,
    else the running mean ``n_bar[0] / n_bar[1]``, which a cooperative layer's misses add to."""
    k = constants[0]
    h2d, workers, reuse_weight = k["h2d_s"], k["cpu_workers"], k["reuse_weight"]
    max_swaps, max_shift, smoothing = k["max_swaps"], k["max_shift"], k["smoothing"]
    p = prio[j]
    # confidence-weighted gate mass per expert, accumulated in routing order (as np.bincount does);
    # dividing by the layer total does not change the ranking, so it is applied only in the dispatch
    p[:] = 0.0
    for t in range(ids.shape[0]):
        c = psi[t]
        for i in range(ids.shape[1]):
            p[ids[t, i]] += weights[t, i] * c  # stale residents (not activated now) stay at 0
    for e in active:
        last[j, e] = forward
    n_act, m = active.shape[0], missed.shape[0]
    if k["adapt"]:
        a = n_act / k["n_experts"]
        u = (n_act - m) / cap if cap else 0.0
        if k["window"]:
            stats[0, j] += a
            stats[1, j] += u
            stats[2, j] += 1
        else:
            r, v = stats[0, j], stats[1, j]
            stats[0, j] = a if r != r else (1 - smoothing) * r + smoothing * a
            stats[1, j] = u if v != v else (1 - smoothing) * v + smoothing * u
    if coop:
        nb = n_bar[2]
        if nb != nb or k["rho_paper"]:  # not profiled offline: the running mean of this run's missed experts
            total_tokens = 0
            for i in range(m):
                total_tokens += missed_tokens[i]
            n_bar[0] += total_tokens
            n_bar[1] += m
            nb = n_bar[0] / n_bar[1]
        if k["rho_paper"]:  # the paper's n-bar * tau_CPU, tau_CPU the one-token CPU time
            rho = split_ratio(nb * cpu_s[1], h2d)
        else:
            rho = split_ratio(cpu_s[rounded_tokens(nb)], h2d)  # hardware_split at this n-bar
        cc = np.empty(m)
        for i in range(m):
            cc[i] = cpu_s[missed_tokens[i]]
        if k["reuse_aware"]:
            total = p.sum()
            if total == 0.0:
                total = 1.0
            in_gpu = split_misses(
                p[missed] / total,
                cc,
                dispatch_s[ids.shape[0]],
                h2d,
                workers,
                rho,
                n_act,
                reuse_weight,
                max_swaps,
                max_shift,
            )
        else:  # load-only dispatch (Fig. 15b): the heaviest misses go to the GPU, priority ignored
            in_gpu = split_misses(
                missed_tokens.astype(np.float64),
                cc,
                dispatch_s[ids.shape[0]],
                h2d,
                workers,
                rho,
                n_act,
                0.0,
                max_swaps,
                max_shift,
            )
        n_gpu = 0
        for i in range(m):
            n_gpu += in_gpu[i]
    else:
        in_gpu = np.ones(m, np.bool_)
        n_gpu = m
    n_cpu = m - n_gpu
    keep = 0
    stale = np.empty(0, np.int64)
    if k["by_priority"] and n_resident + n_gpu > cap:
        keep = min(cap, n_act - n_cpu)
        if keep < cap:  # room left: the most recently used stale residents
            is_active = np.zeros(resident.shape[0], np.bool_)
            for e in active:
                is_active[e] = True
            stale = resident_without(resident, is_active)
            n_stale = stale.shape[0]
            if (
                n_stale > cap - keep and k["stale_by_recency"]
            ):  # a stable sort over ascending ids: ties to lower id
                stale = stale[stable_argsort(-last[j][stale])[: cap - keep]]
            elif n_stale > cap - keep:  # all at priority 0: the lower ids
                stale = stale[: cap - keep]
    out = np.empty(m + keep + stale.shape[0], np.int64)
    g, c = 0, n_gpu
    for i in range(m):
        if in_gpu[i]:
            out[g] = missed[i]
            g += 1
        else:
            out[c] = missed[i]
            c += 1
    if keep == n_act - n_cpu:  # every active expert on the GPU stays: no ranking needed
        c, i = (
            n_gpu,
            m,
        )  # the CPU experts, out[n_gpu:m], ascending as ``active`` is: skipped in one merge pass
        for e in active:
            if c < m and out[c] == e:
                c += 1
            else:
                out[i] = e
                i += 1
    elif keep:
        # Priorities are >= 0 and stale residents have 0 and an older last use, so the ranking by
        # (priority, last use, -id) puts the active experts that stay on the GPU (hits and copies)
        # first, by (priority, -id): one stable sort of ``active`` (sorted by id), CPU experts last
        key = -p[active]
        for i in range(n_gpu, m):
            key[np.searchsorted(active, out[i])] = np.inf
        order = stable_argsort(key)
        for i in range(keep):
            out[m + i] = active[order[i]]
    for i in range(stale.shape[0]):
        out[m + keep + i] = stale[i]
    return out, n_gpu
