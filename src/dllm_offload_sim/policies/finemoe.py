"""FineMoE / fMoE (Yu et al., EuroSys'26): expert-map trajectory matching and fine-grained prefetch."""

from __future__ import annotations

import numpy as np

from dllm_offload_sim.policies.base import LayerDecision, LayerView, OfflineKnowledge, Policy, PolicyError
from dllm_offload_sim.policies.jit import kernel
from dllm_offload_sim.policies.select import admit_misses, lowest_unprotected, ranked_pairs
from dllm_offload_sim.policies.similarity import sparse_dots


@kernel
def _plan_kernel(
    P, rank, csum, caps, thresh, first, start, end, top_k, prob, plan_pri
):  # pragma: no cover (numba)
    """A plan over layers ``first..first + len(P)`` from one stored map (``P``, ``rank``, ``csum`` [n, E]): writes
    each (layer, expert)'s priority into ``plan_pri`` (all else 0) and the planned experts' probability into
    ``prob``; returns the planned (layer, expert) pairs [N, 2], highest priority first, ties by layer, expert."""
    n, E = P.shape
    plan_pri[:] = 0.0
    for r in range(n):
        sel = 0
        for e in range(E):
            if csum[r, e] <= thresh:
                sel += 1
        sel = max(sel, top_k)
        layer = first + r
        decay = 1 - (layer - start) / (end + 1)
        for e in range(E):
            p = P[r, e]
            if rank[r, e] >= caps[layer] or p <= 0:
                continue
            pri = p * decay * (1.0 if rank[r, e] < sel else 1e-3)
            if pri > 0:
                plan_pri[layer, e] = pri
                prob[layer, e] = p
    return ranked_pairs(plan_pri, first, first + n)


@kernel
def _index_map_kernel(m, rank, csum):  # pragma: no cover (numba)
    """Per layer of map ``m`` [L, E]: each expert's rank by probability (best first, stable) into ``rank`` and the
    cumulative probability in that order into ``csum``."""
    L, E = m.shape
    for l in range(L):
        order = np.argsort(-m[l], kind="mergesort")
        acc = 0.0
        for r in range(E):
            rank[l, order[r]] = r
            acc += m[l, order[r]]
            csum[l, r] = acc


@kernel
def _layer_map(ids, weights, n_experts):  # pragma: no cover (numba)
    """Each expert's summed gate weight over the rows of ``ids`` / ``weights`` [T, k], in float64, added in the
    order ``np.bincount(ids.ravel(), weights.ravel())`` adds them."""
    m = np.zeros(n_experts)
    for t in range(ids.shape[0]):
        for i in range(ids.shape[1]):
            m[ids[t, i]] += np.float64(weights[t, i])
    return m


@kernel
def _observe_kernel(
    j, m, total, cur, store_em_j, n, dot, prob, hits, active, missed
):  # pragma: no cover (numba)
    """Layer ``j``'s routing seen: its map ``m`` normalised by ``total`` into ``cur[j]``, that row's dot products with
    the ``n`` stored maps (expert-major ``store_em_j``) added to ``dot``, the eviction score ``prob[j] * hits[j]``
    before this layer returned, then the layer's hits counted (``active`` +1, ``missed`` -1)."""
    E = m.shape[0]
    row = cur[j]
    for e in range(E):
        row[e] = m[e] / total if total > 0 else m[e]
    sparse_dots(store_em_j, row, n, dot, True)
    score = np.empty(E)
    for e in range(E):
        score[e] = prob[j, e] * hits[j, e]
    for e in active:
        hits[j, e] += 1
    for e in missed:
        hits[j, e] -= 1
    return score


@kernel
def _best_match(sq_cum, j, dot, n, cur_sq):  # pragma: no cover (numba)
    """The stored map whose layers ``0..j`` have the highest cosine with this forward's (``dot`` over the norms from
    ``sq_cum`` and ``cur_sq``; 0 where a norm is 0), the first of equals, and that cosine."""
    best, best_cos = 0, 0.0
    for i in range(n):
        den = np.sqrt(sq_cum[i, j] * cur_sq)
        c = dot[i] / den if den > 0 else 0.0
        if i == 0 or c > best_cos:
            best, best_cos = i, c
    return best, best_cos


class FineMoEPolicy(Policy):
    """Trajectory-matched prefetch ``prefetch_distance`` layers ahead, probability x hits eviction.

    Decides:
    * Store: expert maps ``[L, E]`` (per-layer gate-weight distributions) of past forwards: the
      decode forwards of the trace's other requests (at most ``store_capacity``) plus this run's
      finished forwards, the new map replacing the most similar stored one when full.
    * At forward start (the "semantic" prefetch): no token embeddings are traced, so the previous
      forward's own map (the same block one iteration earlier) plans layers ``[0, d)``.
    * After routing at layer ``l``: the stored map whose layers ``0..l`` have the highest cosine with
      this forward's gives similarity ``s``; for each layer in ``[l + 1 + d, L)`` the experts of the
      matched map are taken by probability until their cumulative sum would exceed
      ``1 - s`` (at least top-k), then the rest of the window, weighted by a layer decay
      ``1 - (l' - start) / (end + 1)``; the queue is replaced by that plan (at most ``capacity`` per layer).
    * Every miss is copied on demand; copies and prefetches evict the resident with the lowest
      ``probability x in-cache hits`` not executing or planned (the code's integer truncation of that
      product is not reproduced). No CPU execution. Source: IntelliSys-Lab/FineMoE (baselines.md §2).
    """

    name = "finemoe"
    prefetches = True

    def __init__(self, prefetch_distance: int = 6, store_capacity: int = 1000):
        if prefetch_distance < 0 or store_capacity < 1:
            raise PolicyError("finemoe: prefetch_distance must be >= 0 and store_capacity >= 1")
        self.d, self.store_capacity = prefetch_distance, store_capacity

    def setup(self, ctx):
        super().setup(ctx)
        L, E = ctx.n_layers, ctx.n_experts
        # the store: each slot's map [L, E] (``maps``, a reference: a stored map is never written), the maps
        # expert-major (``store_em``, what matching reads: similarity.dots) and each map's cumulative squared norm over
        # layers. Only the first n_stored slots are ever read, so slots are left unwritten until a map is stored there,
        # and the arrays hold as many slots as maps stored so far (grown as more come, up to store_capacity): a run
        # touches no memory it does not fill
        self._slots = 0
        self.maps: list = []
        self.store_em = self._empty((L, E, 0))
        self.sq_cum = self._empty((0, L))  # cumulative squared norm over layers 0..l
        self.dot = self._empty(0)  # running dot product with this forward's map
        self.n_stored = 0
        # a profiled map's cumulative squared norm by the map's id, made once per run (the other requests' maps are
        # stored again at every batch); and per slot, once a plan reads its map, each expert's rank by probability per
        # layer (best first, stable) and the cumulative probability in that order (what a plan's top-p cut reads),
        # kept for the run where the map is a profiled one
        self._norms: dict = {}
        self._ranks: list = []
        self._profiled: list = []  # per slot: its map is a profiled one (its ranks are kept in _ranked, by id)
        self._ranked: dict = {}
        self.cur_sq = 0.0
        self.cur = np.zeros((L, E))
        self.prev = None  # index in the store of the previous forward's map
        self.prob = np.zeros((L, E))
        self.hits = np.zeros((L, E), np.int64)
        self.plan_pri = np.zeros((L, E))  # priority of each planned (layer, expert); 0 = not planned
        self._caps_arr = None  # the capacities as int64 for the plan kernel (rebuilt when they change)

    def begin_batch(self, knowledge: OfflineKnowledge):
        maps = knowledge.forward_maps
        if len(maps) > self.store_capacity:  # keep an evenly spaced subset
            idx = np.linspace(0, len(maps) - 1, self.store_capacity).round().astype(int)
            maps = [maps[i] for i in idx]
        self.n_stored = 0
        self._reserve(len(maps))
        for m in maps:
            self._put(self.n_stored, *self._norms_of(m))
            self.n_stored += 1
        self.prev = None
        self.hits[:] = 0
        return None

    def _plan(self, i: int, layers: range, thresh: float, start: int, end: int) -> list:
        """Queue for ``layers`` from stored map ``i``: per layer the top-p selected experts (at least top-k)
        weighted by the layer decay, then the rest of the window far behind; ``[N, 2]`` best first."""
        if not len(layers):
            return None
        sl = slice(layers.start, layers.stop)
        m = self.maps[i]
        rank, csum = self._ranks_of(i)
        # per layer: experts ranked below the layer's capacity with probability > 0, the top-p ones (at least top-k)
        # weighted by the layer decay, the others 1e-3 of that
        return _plan_kernel(
            m[sl],
            rank[sl],
            csum[sl],
            self._caps_i64(),
            thresh,
            layers.start,
            start,
            end,
            self.ctx.topology.top_k,
            self.prob,
            self.plan_pri,
        )

    @staticmethod
    def _empty(shape, dtype=float) -> np.ndarray:
        """A new store array whose slots hold whatever memory held (only written slots are read)."""
        return np.empty(shape, dtype)

    def _reserve(self, n: int) -> None:
        """Room for ``n`` stored maps (at most ``store_capacity``): the store's arrays grow, at least doubling, with
        their first ``n_stored`` maps kept."""
        if n <= self._slots:
            return
        k = min(self.store_capacity, max(n, 2 * self._slots))
        keep = self.n_stored
        self.maps.extend([None] * (k - len(self.maps)))
        self._ranks.extend([None] * (k - len(self._ranks)))
        self._profiled.extend([False] * (k - len(self._profiled)))
        for name, axis in (("store_em", 2), ("sq_cum", 0), ("dot", 0)):
            old = getattr(self, name)
            shape = list(old.shape)
            shape[axis] = k
            new = self._empty(tuple(shape), old.dtype)
            idx = (slice(None),) * axis + (slice(0, keep),)
            new[idx] = old[idx]
            setattr(self, name, new)
        self._slots = k

    def _caps_i64(self) -> np.ndarray:
        caps = self.capacities()
        if self._caps_arr is None or not np.array_equal(self._caps_arr, caps):
            self._caps_arr = np.asarray(caps, np.int64)
        return self._caps_arr

    def _ranks_of(self, i: int) -> tuple:
        """Slot ``i``'s map's ranks and cumulative probabilities (see :meth:`setup`), made when a plan first reads
        them."""
        hit = self._ranks[i]
        if hit is None:
            m = self.maps[i]
            hit = self._ranked.get(id(m)) if self._profiled[i] else None
            if hit is None:
                hit = (np.empty(m.shape, np.int32), np.empty(m.shape), m)  # holds m, so its id stays its own
                _index_map_kernel(m, hit[0], hit[1])
                if self._profiled[i]:  # a profiled map is stored again at every batch: its ranks are kept
                    self._ranked[id(m)] = hit
            self._ranks[i] = hit
        return hit[0], hit[1]

    def _norms_of(self, m) -> tuple:
        """A profiled map as float64 and its cumulative squared norm over layers, made once per run."""
        hit = self._norms.get(id(m))
        if hit is None:
            a = np.asarray(m, float)
            hit = self._norms[id(m)] = (
                m,
                a,
                np.cumsum((a * a).sum(-1)),
            )  # the entry holds m, so its id stays its own
        return hit[1], hit[2]

    def _put(self, i: int, m: np.ndarray, sq: np.ndarray | None = None) -> None:
        """Store map ``m`` [L, E] (float64, never written after) in slot ``i``, with its cumulative squared norm
        ``sq`` (computed here without): a profiled map (:meth:`_norms_of`) with it, this run's own map without."""
        self.maps[i] = m
        self._ranks[i] = None
        self._profiled[i] = sq is not None
        self.store_em[:, :, i] = m
        self.sq_cum[i] = np.cumsum((m * m).sum(-1)) if sq is None else sq

    def forward_prefetch(self, fwd):
        self.cur[:] = 0
        self.dot[:] = 0
        self.cur_sq = 0.0
        if self.prev is None or fwd.phase == 0:
            return None
        return self._plan(self.prev, range(min(self.d, self.ctx.n_layers)), 1.0, 0, self.d)

    def decide(self, view: LayerView) -> LayerDecision:
        j, L = view.layer, self.ctx.n_layers
        m = _layer_map(view.ids, view.weights, self.ctx.n_experts)
        n = self.n_stored
        # this layer's map into cur[j] and the running dot products; the hits: the active experts but the missed
        score = _observe_kernel(
            j,
            m,
            m.sum(),
            self.cur,
            self.store_em[j],
            n,
            self.dot,
            self.prob,
            self.hits,
            view.active,
            view.missed,
        )
        self.cur_sq += float(self.cur[j] @ self.cur[j])
        to_gpu = view.missed.tolist()
        kept, evicted, entered = admit_misses(
            view.resident_row(self.ctx.n_experts),
            view.missed.astype(np.int64),
            view.active,
            view.capacity,
            score,
        )
        retain = set(kept.tolist())
        self.hits[j, evicted] = 0
        self.prob[j, evicted] = 0
        self.hits[j, entered] = 1
        self.prob[j, entered] = self.cur[j, entered]
        plan = None
        start = j + 1 + self.d
        if n and start < L:
            best, cos = _best_match(self.sq_cum, j, self.dot, n, self.cur_sq)
            thresh = min(max(1.0 - cos, 0.0), 1.0)
            plan = self._plan(best, range(start, L), thresh, start, L - 1)
        return LayerDecision(to_gpu=to_gpu, to_cpu=[], retain=retain, prefetch=plan)

    def end_forward(self, fwd):
        if fwd.phase == 0:
            return
        n = self.n_stored
        if n < self.store_capacity:
            self._reserve(n + 1)
            self.prev = n
            self.n_stored += 1
        else:  # full: replace the most similar stored map (whole-trajectory cosine)
            den = np.sqrt(self.sq_cum[:n, -1] * self.cur_sq)
            cos = np.divide(self.dot[:n], den, out=np.zeros(n), where=den > 0)
            self.prev = int(np.argmax(cos))
        self._put(self.prev, self.cur.copy())

    def prefetch_victim(self, layer, expert, resident, protected):
        v = lowest_unprotected(resident, self.prob[layer] * self.hits[layer], self.plan_pri[layer], protected)
        if v is not None:
            self.hits[layer, v] = 0
            self.prob[layer, v] = 0
        return v

    def on_prefetch_done(self, layer, expert):
        self.hits[layer, expert] += 1

    def trim(self, layer, resident, capacity):
        score = self.prob[layer] * self.hits[layer]
        return set(sorted(resident, key=lambda e: (-score[e], e))[:capacity])
