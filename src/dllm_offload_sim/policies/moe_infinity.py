"""MoE-Infinity (Xue et al.): request-level activation matching, prefetch of later layers, LFU-like eviction."""

from __future__ import annotations

import numpy as np

from dllm_offload_sim.policies.base import LayerDecision, LayerView, OfflineKnowledge, Policy, PolicyError
from dllm_offload_sim.policies.jit import kernel
from dllm_offload_sim.policies.select import admit_misses, lowest_unprotected
from dllm_offload_sim.policies.similarity import dots


def _row_normalise(m: np.ndarray) -> np.ndarray:
    s = m.sum(-1, keepdims=True)
    return np.divide(m, s, out=np.zeros_like(m, dtype=float), where=s > 0)


@kernel
def _plan_pairs(entry, decay, j, cand, keep):  # pragma: no cover (numba)
    """The plan from stored entry ``entry`` [L, E] at layer ``j``: each later layer's candidates (``cand`` [L, C]: the
    layer's experts by ``entry`` value, best first, ties to the lower id; -1 past its capacity) scored
    ``entry[l, e] * decay[l]``, those above 0 kept (``keep`` [L, E] is set to them); their (layer, expert) pairs
    [N, 2], highest score first, ties in (layer, expert) order (``select.ranked_pairs`` of the scores). Each layer's
    pairs come sorted already (the decay scales a whole layer), so the layers' runs are merged."""
    L, C = cand.shape
    keep[:] = False
    n = 0
    for l in range(j + 1, L):
        for r in range(C):
            e = cand[l, r]
            if e >= 0 and entry[l, e] * decay[l] > 0:
                n += 1
    keys = np.empty(n)
    pairs = np.empty((n, 2), np.int64)
    starts = np.empty(L - j, np.int64)  # where each later layer's run starts, then the end
    i = 0
    for l in range(j + 1, L):
        starts[l - j - 1] = i
        first = i
        for r in range(C):
            e = cand[l, r]
            if e < 0:
                break
            p = entry[l, e] * decay[l]
            if p > 0:
                keep[l, e] = True
                # in place by (score, expert): a product can tie two experts whose values differ
                k = i
                while k > first and (keys[k - 1] > -p or (keys[k - 1] == -p and pairs[k - 1, 1] > e)):
                    keys[k] = keys[k - 1]
                    pairs[k, 0], pairs[k, 1] = l, pairs[k - 1, 1]
                    k -= 1
                keys[k] = -p
                pairs[k, 0], pairs[k, 1] = l, e
                i += 1
    starts[L - j - 1] = n
    order = np.arange(n)
    buf = np.empty(n, np.int64)
    runs, width = L - j - 1, 1
    while width < runs:  # stable merges of adjacent runs: a tie takes the earlier layer's
        for a in range(0, runs, 2 * width):
            lo, mid, hi = starts[a], starts[min(a + width, runs)], starts[min(a + 2 * width, runs)]
            x, y, o = lo, mid, lo
            while x < mid and y < hi:
                if keys[order[y]] < keys[order[x]]:
                    buf[o] = order[y]
                    y += 1
                else:
                    buf[o] = order[x]
                    x += 1
                o += 1
            while x < mid:
                buf[o] = order[x]
                x += 1
                o += 1
            while y < hi:
                buf[o] = order[y]
                y += 1
                o += 1
        order, buf = buf, order
        width *= 2
    return pairs[order]


class MoEInfinityPolicy(Policy):
    """Expert Activation Matrix (EAM) matching with prefetch for the remaining layers; all-GPU.

    Decides:
    * State: the current batch's EAM ``[L, E]`` (routed-token counts so far) and the EAM collection
      (EAMC): the per-request EAMs of the trace's other requests (offline traces, at most
      ``trace_capacity``).
    * At each MoE layer ``l``: match the current EAM to the EAMC entry with the highest mean per-layer
      cosine over the rows observed so far (the evident intent; the code's row masking looks
      inverted, baselines.md §1). Re-plan: clear queued prefetches and queue, for every later layer
      ``l'`` of this forward, its experts by ``matched_ratio * (1 - (l' - l) / (L + 1))``, best first.
      Only the first ``capacity`` experts of each later layer are queued and protected from eviction
      (with one slot per layer only, MoE-Infinity's protect-every-candidate rule would forbid every
      prefetch eviction).
    * Every miss is copied on demand (ahead of prefetches; an expert whose prefetch is queued is
      taken as a demand miss, one already in flight is waited for). Copies are admitted by evicting
      the resident with the lowest in-cache visit count that the layer is not executing; visit
      counts rise on every use or prefetch and reset on eviction and between batches (as the
      examples reset them). A prefetch into a full layer evicts the lowest-count resident that is
      not protected, or is skipped.
    Never runs experts on the CPU. Source: EfficientMoE/MoE-Infinity (baselines.md §1).
    """

    name = "moe_infinity"
    prefetches = True

    def __init__(self, trace_capacity: int = 1000):
        if trace_capacity < 1:
            raise PolicyError(f"moe_infinity: trace_capacity must be >= 1, got {trace_capacity}")
        self.trace_capacity = trace_capacity

    def setup(self, ctx):
        super().setup(ctx)
        L, E = ctx.n_layers, ctx.n_experts
        self.eamc = np.zeros((0, L, E))
        self.eam = np.zeros((L, E))
        self.visits = np.zeros((L, E), np.int64)
        self.planned = False  # a plan is current: its experts are marked in self._keep
        self._keep = None
        # per deciding layer j, the plan's weight of each layer: 1 - (l - j) / (L + 1)
        self._decay = [1 - (np.arange(L) - j) / (L + 1) for j in range(L)]

    def begin_batch(self, knowledge: OfflineKnowledge):
        entries = knowledge.request_counts[: self.trace_capacity]
        self.eamc = _row_normalise(np.asarray(entries, float)) if entries else np.zeros((0,) + self.eam.shape)
        self.eamc_norm = np.linalg.norm(self.eamc, axis=-1)  # [N, L]
        self.eamc_em = np.ascontiguousarray(self.eamc.transpose(1, 2, 0))  # [L, E, N] (similarity.dots)
        self.num = np.zeros(
            (len(self.eamc), self.eam.shape[0])
        )  # [N, L] dot products with the current EAM's rows
        self.cos = np.zeros_like(self.num)  # [N, L] their cosines (0 where a norm is 0)
        self._cuts = {}  # (entry, capacities) -> [L, C] each row's `capacity` best experts of that entry, best first
        self.eam[:] = 0
        self.cur_norm = np.zeros(self.eam.shape[0])  # L2 norms of the EAM's rows normalised to sum 1
        self.visits[:] = 0
        return None

    def _match(self) -> int | None:
        """The index of the EAMC entry with the highest mean per-layer cosine over the layers observed so far."""
        if not len(self.eamc):
            return None
        norm = self.cur_norm
        observed = norm > 0
        if not observed.any():
            return None
        cos = self.cos if observed.all() else self.cos[:, observed]
        return int(np.argmax(cos.mean(-1)))

    def decide(self, view: LayerView) -> LayerDecision:
        j = view.layer
        self.eam[j, view.active] += view.tokens
        if len(
            self.eamc
        ):  # only row j of the EAM changed: its normalised row, norm and dot products with the entries
            row = self.eam[j]
            total = row.sum()
            cur = row / total if total > 0 else np.zeros_like(row)  # the row normalised to sum 1
            self.cur_norm[j] = np.sqrt(np.add.reduce(cur * cur))
            self.num[:, j] = dots(self.eamc_em[j], cur, len(self.eamc))
            den = self.eamc_norm[:, j] * self.cur_norm[j]
            np.divide(self.num[:, j], den, out=self.cos[:, j], where=den > 0)
            self.cos[den <= 0, j] = 0.0
        vis = self.visits[j]
        vis[view.active] += 1  # the hits: the active experts but the missed ones (a subset)
        vis[view.missed] -= 1
        to_gpu = sorted(view.missed.tolist())
        kept, evicted, entered = admit_misses(
            view.resident_row(self.ctx.n_experts),
            np.asarray(to_gpu, np.int64),
            view.active,
            view.capacity,
            vis,
        )
        retain = set(kept.tolist())
        vis[evicted] = 0
        vis[entered] = 1
        m = self._match()
        if m is None:
            self.planned = False
            return LayerDecision(to_gpu=to_gpu, to_cpu=[], retain=retain, prefetch=[])
        self.planned = True
        return LayerDecision(to_gpu=to_gpu, to_cpu=[], retain=retain, prefetch=self._queue(j, m))

    def _queue(self, j: int, entry: int) -> np.ndarray:
        """Every planned (layer, expert) pair after layer ``j``, best first: per later layer its ``capacity`` best
        experts of stored entry ``entry``, scored by the entry's share times the layer's decay."""
        caps = np.asarray(self.capacities())
        L, E = self.eam.shape
        key = (entry, caps.tobytes())
        cand = self._cuts.get(key)
        if cand is None:  # each row's `cap_l` best (ties to the lower id), best first; -1 past them
            order = np.argsort(-self.eamc[entry], axis=1, kind="stable")
            cand = np.where(np.arange(E)[None, :] < caps[:, None], order, -1)[:, : max(int(caps.max()), 1)]
            self._cuts[key] = cand = np.ascontiguousarray(cand, np.int64)
        if self._keep is None:  # each layer's planned experts, protected from prefetch eviction
            self._keep = np.empty((L, E), bool)
        return _plan_pairs(self.eamc[entry], self._decay[j], j, cand, self._keep)

    def prefetch_victim(self, layer, expert, resident, protected):
        vis = self.visits[layer]
        v = lowest_unprotected(resident, vis, self._keep[layer] if self.planned else None, protected)
        if v is not None:
            vis[v] = 0
        return v

    def on_prefetch_done(self, layer, expert):
        self.visits[layer, expert] += 1

    def trim(self, layer, resident, capacity):
        vis = self.visits[layer]
        return set(sorted(resident, key=lambda e: (-vis[e], e))[:capacity])
