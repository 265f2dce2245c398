"""Small selection helpers shared by policies (deterministic tie-breaking by expert id)."""

from __future__ import annotations

import numpy as np

from dllm_offload_sim.policies.jit import kernel, stable_argsort


def keep_top(candidates, key, capacity: int) -> set:
    """The ``capacity`` candidates with the largest ``key(e)``; ties go to the smaller expert id."""
    if capacity <= 0:
        return set()
    cands = list(candidates)
    if len(cands) <= capacity:
        return set(cands)
    cands.sort()
    cands.sort(key=key, reverse=True)  # stable: equal keys keep ascending ids
    return set(cands[:capacity])


def proportional_slots(weights: np.ndarray, total: int, lo: int, hi: int) -> np.ndarray:
    """Integer slots proportional to ``weights`` summing to ``total``, each within [lo, hi].

    Largest-remainder rounding; the floor ``lo`` is given first, the rest in proportion (negative weights count
    as 0, all-zero weights as equal).
    """
    w = np.ascontiguousarray(weights, np.float64)
    return _proportional_slots(w, int(total), int(lo), int(hi))


@kernel
def numpy_sum(a):  # pragma: no cover (numba)
    """``a.sum()`` of a contiguous float64 row, added in numpy's order (its pairwise summation: eight running
    sums over blocks of up to 128, halves above that), so a kernel's total is bit-equal to numpy's."""
    n = a.shape[0]
    if n < 8:
        s = 0.0
        for i in range(n):
            s += a[i]
        return s
    if n <= 128:
        r = a[:8].copy()
        i = 8
        while i < n - n % 8:
            for q in range(8):
                r[q] += a[i + q]
            i += 8
        s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        while i < n:
            s += a[i]
            i += 1
        return s
    half = n // 2
    half -= half % 8
    return numpy_sum(a[:half]) + numpy_sum(a[half:])


@kernel
def _proportional_slots(weights, total, lo, hi):  # pragma: no cover (numba)
    n = weights.shape[0]
    lo = min(lo, total // n)
    w = np.empty(n)
    for i in range(n):
        x = weights[i]
        w[i] = x if x >= 0 or x != x else 0.0  # np.clip(x, 0, None)
    s = numpy_sum(w)
    if s <= 0:
        w[:] = 1.0
        s = numpy_sum(w)
    free = total - lo * n
    caps = np.empty(n, np.int64)
    neg_rem = np.empty(n)
    left = total
    for i in range(n):
        share = free * w[i] / s
        f = np.floor(share)
        caps[i] = min(lo + np.int64(f), hi)
        neg_rem[i] = -(share - f)
        left -= caps[i]
    order = stable_argsort(neg_rem)  # biggest remainder first, then the lower layer
    while left > 0:
        moved = False
        for i in order:
            if left == 0:
                break
            if caps[i] < hi:
                caps[i] += 1
                left -= 1
                moved = True
        if not moved:
            break
    return caps


def admit(resident, transferred, executing, capacity: int, score) -> set:
    """Cache contents after admitting ``transferred`` experts one by one.

    Each needs a free slot or evicts the lowest-``score`` resident that is not ``executing`` (ties to
    the lower id); when neither exists the expert bypasses the cache. ``score`` is indexed by expert id
    (an array); ``executing`` is any iterable of expert ids. Used by the engines of MoE-Infinity and FineMoE,
    whose runtime admits on-demand copies this way.
    """
    cache = set(resident)
    if not cache.isdisjoint(transferred):  # a resident re-admitted: replay the admissions one by one
        evictable = sorted(cache.difference(executing), key=lambda e: (score[e], e))
        for e in transferred:
            if e in cache:
                continue
            if len(cache) >= capacity:
                if not evictable:
                    continue
                cache.discard(evictable.pop(0))
            cache.add(e)
        return cache
    # none resident (the runtime's case: demand copies of missed experts)
    row = np.zeros(len(score), np.bool_)
    if cache:
        row[np.fromiter(cache, np.int64, len(cache))] = True
    new = np.fromiter(dict.fromkeys(transferred), np.int64)
    busy = np.fromiter(executing, np.int64)
    retained, _, _ = admit_misses(row, new, busy, capacity, np.asarray(score))
    return set(retained.tolist())


@kernel
def admit_misses(resident_row, missed, executing, capacity, score):  # pragma: no cover (numba)
    """:func:`admit` where none of ``missed`` (distinct ids) is resident (``resident_row``, a mask by expert): the
    first ones take the free slots, each later one evicts the next lowest-``score`` resident that is not
    ``executing`` (ties to the lower id) while there is one, and the rest bypass the cache. Returns the experts
    retained (ascending), those evicted and those entered (both in the order they were)."""
    E = resident_row.shape[0]
    busy = np.zeros(E, np.bool_)
    for e in executing:
        busy[e] = True
    n_res = n_evictable = 0
    for e in range(E):
        if resident_row[e]:
            n_res += 1
            n_evictable += not busy[e]
    free = max(0, capacity - n_res)
    n_evict = min(max(missed.shape[0] - free, 0), n_evictable)
    evictable = np.empty(n_evictable, np.int64)
    k = 0
    for e in range(E):
        if resident_row[e] and not busy[e]:
            evictable[k] = e
            k += 1
    keys = np.empty(n_evictable, score.dtype)
    for i in range(n_evictable):
        keys[i] = score[evictable[i]]
    evicted = evictable[stable_argsort(keys)[:n_evict]] if n_evict > 0 else evictable[:0]
    entered = missed[: min(missed.shape[0], free + n_evict)]
    keep = resident_row.copy()
    for e in evicted:
        keep[e] = False
    for e in entered:
        keep[e] = True
    return np.flatnonzero(keep), evicted, entered


def lowest_unprotected(resident, key: np.ndarray, planned: np.ndarray | None, *protected) -> int | None:
    """The expert of ``resident`` with the lowest ``key[e]`` (an array by expert id), ties to the lower id, among
    those not ``planned`` (an array by expert id whose nonzero entries protect that expert; None: none) and in none
    of the ``protected`` sets; None where every resident is protected. The prefetch victim of the
    trajectory-matching policies (MoE-Infinity, FineMoE), whose plan marks the experts it protects."""
    protected = [p for p in protected if p]
    cands = resident.difference(*protected) if protected else resident
    if not cands:
        return None
    a = np.fromiter(cands, np.int64, len(cands))
    v = _lowest_unplanned(a, key, planned is not None, key if planned is None else planned)
    return None if v < 0 else int(v)


@kernel
def _lowest_unplanned(cands, key, use_planned, planned):  # pragma: no cover (numba)
    """The id of ``cands`` with the lowest ``key`` (ties to the lower id) whose ``planned`` entry is 0 (all
    candidates when not ``use_planned``); -1 if none."""
    best, best_key = -1, np.inf
    for e in cands:
        if use_planned and planned[e] != 0:
            continue
        k = key[e]
        if best < 0 or k < best_key or (k == best_key and e < best):
            best, best_key = e, k
    return best


def keep_top_by(cands: np.ndarray, capacity: int, *keys: np.ndarray) -> set:
    """Like :func:`keep_top` for array candidates (distinct ids): ``keys`` (aligned with ``cands``, most
    significant first) are compared descending, NaN lowest, ties go to the smaller id."""
    if capacity <= 0:
        return set()
    if len(cands) <= capacity:
        return set(cands.tolist())
    if len(keys) == 1:
        return set(_top_by(cands, capacity, keys[0], keys[0]).tolist())
    if len(keys) == 2:
        return set(_top_by(cands, capacity, keys[0], keys[1]).tolist())
    order = np.lexsort((cands,) + tuple(-np.asarray(k) for k in reversed(keys)))
    return set(cands[order[:capacity]].tolist())


@kernel
def _rank(ka, kb):  # pragma: no cover (numba)
    """-1 where key ``ka`` ranks before ``kb`` (larger; NaN last), 1 where after, 0 where equal."""
    if ka != ka:
        return 0 if kb != kb else 1
    if kb != kb or ka > kb:
        return -1
    return 1 if ka < kb else 0


@kernel
def _top_by(cands, capacity, k0, k1):  # pragma: no cover (numba)
    """The ``capacity`` best of ``cands`` by (``k0`` descending, then ``k1`` descending, then id ascending), NaN
    keys last (as ``np.lexsort`` of the negated keys orders them): a bounded insertion into the best so far."""
    best = np.empty(capacity, np.int64)  # indices into cands, best first
    n = 0
    for i in range(cands.shape[0]):
        pos = n
        while pos > 0:
            j = best[pos - 1]
            c = _rank(k0[i], k0[j])
            if c == 0:
                c = _rank(k1[i], k1[j])
                if c == 0:
                    c = -1 if cands[i] < cands[j] else 1
            if c > 0:
                break
            pos -= 1
        if pos >= capacity:
            continue
        stop = min(n, capacity - 1)
        for q in range(stop, pos, -1):
            best[q] = best[q - 1]
        best[pos] = i
        n = min(n + 1, capacity)
    return cands[best[:n]]


@kernel
def resident_and(resident_row, extra):  # pragma: no cover (numba)
    """The experts of ``resident_row`` (a mask by expert), ascending, then those of ``extra``: a layer's candidates
    to retain after it copied ``extra``."""
    n = 0
    for e in range(resident_row.shape[0]):
        n += resident_row[e]
    cands = np.empty(n + extra.shape[0], np.int64)
    k = 0
    for e in range(resident_row.shape[0]):
        if resident_row[e]:
            cands[k] = e
            k += 1
    cands[k:] = extra
    return cands


@kernel
def resident_without(resident_row, excluded):  # pragma: no cover (numba)
    """The experts of ``resident_row`` (a mask by expert) that ``excluded`` (a mask by expert) does not mark,
    ascending."""
    n = 0
    for e in range(resident_row.shape[0]):
        n += resident_row[e] and not excluded[e]
    out = np.empty(n, np.int64)
    k = 0
    for e in range(resident_row.shape[0]):
        if resident_row[e] and not excluded[e]:
            out[k] = e
            k += 1
    return out


@kernel
def top_of(cands, capacity, k0, k1):  # pragma: no cover (numba)
    """:func:`keep_top_by` of two keys (aligned with ``cands``) as a compiled kernel: the ``capacity`` best of
    ``cands`` by (``k0``, ``k1``) descending, ties to the lower id, as an array (in no particular order)."""
    if capacity <= 0:
        return cands[:0]
    if cands.shape[0] <= capacity:
        return cands
    return _top_by(cands, capacity, k0, k1)


@kernel
def ranked_pairs(pri, first, stop):  # pragma: no cover (numba)
    """The (layer, expert) pairs of rows ``first..stop - 1`` of ``pri`` [L, E] with priority > 0, as [N, 2],
    highest priority first; ties stay in (layer, expert) order (a stable sort)."""
    E = pri.shape[1]
    count = 0
    for l in range(first, stop):
        for e in range(E):
            if pri[l, e] > 0:
                count += 1
    keys = np.empty(count)
    pairs = np.empty((count, 2), np.int64)
    i = 0
    for l in range(first, stop):
        for e in range(E):
            if pri[l, e] > 0:
                keys[i] = -pri[l, e]
                pairs[i, 0], pairs[i, 1] = l, e
                i += 1
    return pairs[np.argsort(keys, kind="mergesort")]
