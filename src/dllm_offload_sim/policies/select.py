"""Small selection helpers shared by policies (deterministic tie-breaking by expert id)."""

from __future__ import annotations

import numpy as np

from dllm_offload_sim.policies.jit import kernel


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

    Largest-remainder rounding; the floor ``lo`` is given first, the rest in proportion.
    """
    n = len(weights)
    lo = min(lo, total // n)
    w = np.clip(np.asarray(weights, float), 0, None)
    free = total - lo * n
    if w.sum() <= 0:
        w = np.ones(n)
    share = free * w / w.sum()
    caps = lo + np.floor(share).astype(np.int64)
    caps = np.minimum(caps, hi)
    rem = share - np.floor(share)
    left = total - int(caps.sum())
    order = np.lexsort((np.arange(n), -rem))  # biggest remainder first, then lower layer
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
    # none resident (the runtime's case: demand copies of missed experts): the first free-slot ones enter, each
    # later one evicts the next lowest-scored evictable resident while there is one, the rest bypass
    new = list(dict.fromkeys(transferred))
    free = max(0, capacity - len(cache))
    n_evict = len(new) - free
    if n_evict > 0:
        evictable = np.array(sorted(cache.difference(executing)), np.int64)
        n_evict = min(n_evict, len(evictable))
        if n_evict:  # a stable sort by score over ascending ids: ties go to the lower id
            cache.difference_update(evictable[np.argsort(score[evictable], kind="stable")[:n_evict]].tolist())
        new = new[:free + n_evict]
    cache.update(new)
    return cache


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
    """Like :func:`keep_top` for array candidates: ``keys`` (aligned with ``cands``, most
    significant first) are compared descending, ties go to the smaller id."""
    if capacity <= 0:
        return set()
    if len(cands) <= capacity:
        return set(cands.tolist())
    if len(keys) == 1:
        order = np.lexsort((cands, -keys[0]))
    elif len(keys) == 2:
        order = np.lexsort((cands, -keys[1], -keys[0]))
    else:
        order = np.lexsort((cands,) + tuple(-np.asarray(k) for k in reversed(keys)))
    return set(cands[order[:capacity]].tolist())


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
