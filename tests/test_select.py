"""The selection helpers' compiled forms (``policies.select``, OLED's confidence row) give exactly what their
numpy formulations give, so the policies that call them decide the same."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_offload_sim.policies.oled import PSI, psi_row
from dllm_offload_sim.policies.select import keep_top_by, numpy_sum, proportional_slots


def lexsort_top(cands, capacity, *keys):
    """The numpy formulation: a lexsort of the negated keys, ties to the smaller id."""
    if capacity <= 0:
        return set()
    order = np.lexsort((cands,) + tuple(-np.asarray(k) for k in reversed(keys)))
    return set(cands[order[:capacity]].tolist())


def numpy_proportional(weights, total, lo, hi):
    """The numpy formulation of largest-remainder slots."""
    n = len(weights)
    lo = min(lo, total // n)
    w = np.clip(np.asarray(weights, float), 0, None)
    free = total - lo * n
    if w.sum() <= 0:
        w = np.ones(n)
    share = free * w / w.sum()
    caps = np.minimum(lo + np.floor(share).astype(np.int64), hi)
    rem = share - np.floor(share)
    left = total - int(caps.sum())
    order = np.lexsort((np.arange(n), -rem))
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


keys = st.sampled_from(["int", "float", "nan"])


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 200), st.integers(0, 210), keys, keys, st.integers(0, 2**31 - 1))
def test_keep_top_by_keeps_what_a_lexsort_of_the_negated_keys_keeps(n, capacity, kind0, kind1, seed):
    rng = np.random.default_rng(seed)
    cands = rng.permutation(256)[:n].astype(np.int64)

    def key(kind):
        if kind == "int":
            return rng.integers(-3, 4, n).astype(np.int64)
        k = rng.random(n).round(1)  # coarse: many ties
        if kind == "nan":
            k[rng.random(n) < 0.3] = np.nan
        return k

    k0, k1 = key(kind0), key(kind1)
    assert keep_top_by(cands, capacity, k0) == lexsort_top(cands, capacity, k0)
    assert keep_top_by(cands, capacity, k0, k1) == lexsort_top(cands, capacity, k0, k1)


def test_numpy_sum_adds_in_numpys_order():
    """Bit-equal to ``ndarray.sum`` at every length across the pairwise blocks (0-300), on values whose sums round."""
    rng = np.random.default_rng(3)
    for n in range(301):
        a = (rng.random(n) - 0.3) * 10.0 ** rng.integers(-3, 6, n)
        assert numpy_sum(a) == a.sum(), n


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 64), st.integers(0, 40), st.integers(0, 300), st.booleans(), st.integers(0, 2**31 - 1))
def test_proportional_slots_equals_the_numpy_formulation(n, lo, extra, zero, seed):
    rng = np.random.default_rng(seed)
    w = np.zeros(n) if zero else (rng.random(n) - 0.2) * 10.0 ** rng.integers(-2, 3)
    total = n + extra * n // 10 + int(rng.integers(0, n))
    hi = int(rng.integers(max(1, -(-total // n)), 300))
    got = proportional_slots(w, total, lo, hi)
    assert np.array_equal(got, numpy_proportional(w, total, lo, hi))
    assert got.dtype == np.int64 and int(got.sum()) == min(total, hi * n) and got.max() <= hi


def test_oleds_confidence_row_equals_the_numpy_formulation():
    """``psi(clip(c, 0, 1))`` in float32 with NaN read as the default confidence, for each psi."""
    rng = np.random.default_rng(7)
    c = np.concatenate([rng.uniform(-0.5, 1.5, 200), [np.nan, 0.0, -0.0, 1.0, np.inf, -np.inf]]).astype(
        np.float32
    )
    numpy_psi = {"linear": lambda x: x, "square": lambda x: x * x, "sqrt": np.sqrt}
    for default in (1.0, 0.5):
        want = np.where(np.isnan(c), np.float32(default), c)
        want = np.clip(want, 0.0, 1.0)
        for mode, name in enumerate(PSI):
            got = psi_row(c, np.float32(default), mode)
            assert got.dtype == np.float32
            assert np.array_equal(got, numpy_psi[name](want).astype(np.float32)), name


def test_shared_belady_keeps_the_soonest_used_experts_of_the_pool():
    """``_keep_soonest`` (compiled) keeps what sorting every held expert by (next use, layer, id) keeps."""
    from dllm_offload_sim.policies.belady_shared import _keep_soonest

    never = np.iinfo(np.int32).max
    rng = np.random.default_rng(3)
    for trial in range(50):
        L, E = int(rng.integers(1, 5)), int(rng.integers(2, 12))
        held = rng.random((L, E)) < 0.6
        nxt = [
            np.where(rng.random((L, E)) < 0.2, never, rng.integers(0, 6, (L, E))).astype(np.int32)
            for _ in "ab"
        ]
        j, slots = int(rng.integers(0, L)), int(rng.integers(0, L * E + 2))
        use = np.where(np.arange(L)[:, None] <= j, nxt[0], nxt[1]).astype(np.int64)
        lay, exp = np.nonzero(held & (use < never))
        order = np.lexsort((exp, use[lay, exp] * L + lay))[:slots]
        want = np.zeros((L, E), bool)
        want[lay[order], exp[order]] = True
        got = held.copy()
        _keep_soonest(got, j, nxt[0], nxt[1], slots)
        np.testing.assert_array_equal(got, want, err_msg=f"trial {trial}")


@settings(max_examples=200, deadline=None)
@given(data=st.data(), L=st.integers(1, 6), E=st.integers(1, 12), cap=st.integers(0, 12))
def test_moe_infinitys_plan_is_a_stable_sort_of_its_scores(data, L, E, cap):
    """MoE-Infinity's plan (its layers' runs merged) is every later layer's ``cap`` best experts with a score above
    0, sorted by score, ties in (layer, expert) order, as a stable sort of the scores orders them; values and
    decays drawn from few levels so that scores tie, within a layer and across layers."""
    from dllm_offload_sim.policies.moe_infinity import _plan_pairs

    entry = np.array(
        data.draw(st.lists(st.sampled_from([0.0, 0.1, 0.2, 0.3, 1 / 3]), min_size=L * E, max_size=L * E))
    )
    entry = entry.reshape(L, E)
    decay = np.array(data.draw(st.lists(st.sampled_from([0.25, 0.5, 0.6, 1.0]), min_size=L, max_size=L)))
    j = data.draw(st.integers(-1, L - 1))
    order = np.argsort(-entry, axis=1, kind="stable")
    cut = np.zeros((L, E), bool)
    np.put_along_axis(cut, order, np.arange(E)[None, :] < cap, axis=1)
    cand = np.ascontiguousarray(np.where(np.arange(E)[None, :] < cap, order, -1)[:, : max(cap, 1)], np.int64)
    keep = np.zeros((L, E), bool)
    got = _plan_pairs(entry, decay, j, cand, keep)
    score = entry * decay[:, None]
    want_keep = cut & (score > 0) & (np.arange(L)[:, None] > j)
    ls, es = np.nonzero(want_keep)  # (layer, expert) order
    want = np.stack([ls, es], 1)[np.argsort(-score[ls, es], kind="stable")]
    assert np.array_equal(keep, want_keep) and np.array_equal(got.reshape(-1, 2), want.reshape(-1, 2))
