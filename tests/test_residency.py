"""The residency driver: the one place a policy's residency, capacities and decisions are kept and checked."""

from __future__ import annotations

import numpy as np
import pytest

from dllm_offload_sim.policies.base import (
    CostHints,
    ForwardInfo,
    LayerDecision,
    OfflineKnowledge,
    Policy,
    PolicyContext,
    PolicyError,
)
from dllm_offload_sim.policies.naive_lru import NaiveLRUPolicy
from dllm_offload_sim.policies.residency import ResidencyDriver
from tests.simkit import tiny_topology

TOPO = tiny_topology(n_moe=2, n_experts=8)


def info(i=0, n=2):
    return ForwardInfo(
        index=i, phase=1, n_tokens=n, prev_confidence=np.full(n, np.nan), masked=np.ones(n, bool)
    )


def layer(driver, j, ids, i=0):
    ids = np.asarray(ids, np.int64)
    active, tokens = np.unique(ids, return_counts=True)
    return driver.decide(info(i, len(ids)), j, ids, np.ones(ids.shape), active, tokens)


class Scripted(Policy):
    """Answers each decide with the next scripted decision; capacities and placements as set."""

    name = "scripted"

    def __init__(self, answers=(), caps=None, placement=None):
        self.answers, self.caps, self.placement = list(answers), caps, placement

    def capacities(self):
        return self._caps if self.caps is None else np.asarray(self.caps)

    def begin_batch(self, knowledge):
        return self.placement

    def decide(self, view):
        return self.answers.pop(0)


def driver(policy, cache=3):
    return ResidencyDriver(policy, PolicyContext(TOPO, cache, CostHints.constant()))


def test_view_holds_the_layers_residency_and_counts_are_kept():
    d = driver(NaiveLRUPolicy())
    d.start()
    d.begin_forward(info())
    plan = layer(d, 0, [[1, 2], [2, 3]])
    assert plan.view.resident == frozenset() and plan.missed == [1, 2, 3] and plan.missed_tokens == [1, 2, 1]
    assert plan.to_gpu == [1, 2, 3] and plan.to_cpu == []
    assert (
        d.end_layer(0, plan)
        and d.resident[0] == frozenset({1, 2, 3})
        and d.mask[0].nonzero()[0].tolist() == [1, 2, 3]
    )
    plan = layer(d, 0, [[1, 2], [2, 4]])
    assert plan.n_hits == 2 and plan.missed == [4]
    n = d.end_forward(info())
    assert (n.hits, n.misses, n.to_gpu, n.to_cpu) == (2, 4, 4, 0) and n.policy_s >= 0
    assert d.policy_calls == 2


@pytest.fixture
def clock(monkeypatch):
    """The driver's clock, advanced by hand (``clock.t``): a policy hook that adds to it takes that long."""
    import dllm_offload_sim.policies.residency as residency

    class Clock:
        t = 0.0

        def perf_counter(self):
            return self.t

    c = Clock()
    monkeypatch.setattr(residency, "time", c)
    return c


def test_a_policys_per_forward_hooks_count_as_its_decision_time(clock):
    """The replay counts the time in a policy's begin- and end-of-forward hooks as decision time, so the driver's run
    total (what the simulator reports and the validator charges) counts it too: FineMoE stores its map there."""

    class SlowHooks(NaiveLRUPolicy):
        def begin_forward(self, fwd):
            clock.t += 1e-3

        def end_forward(self, fwd):
            clock.t += 2e-3

    d = driver(SlowHooks())
    d.start()
    d.begin_forward(info())
    layer(d, 0, [[1, 2]])
    n = d.end_forward(info())
    assert (
        n.policy_s == pytest.approx(3e-3) and d.policy_wall_s == pytest.approx(3e-3) and d.policy_calls == 1
    )


def test_a_policys_prefetch_hooks_count_as_its_decision_time(clock):
    """The forward's prefetch plan, each prefetch's victim and each arrival are policy code the runtime's host runs
    between the GPU's work: the driver counts them in the forward's and the run's decision time."""

    class SlowPrefetcher(NaiveLRUPolicy):
        prefetches = True

        def forward_prefetch(self, fwd):
            clock.t += 1e-3
            return [(1, 7)]

        def prefetch_victim(self, layer, expert, resident, protected):
            clock.t += 2e-3
            return min(resident)

        def on_prefetch_done(self, layer, expert):
            clock.t += 4e-3

    d = driver(SlowPrefetcher())
    d.start()
    d.set_resident(1, {1, 2, 3})
    d.begin_forward(info())
    assert d.forward_prefetch(info()) == [(1, 7)] and d.prefetch_victim(1, 7) == 1
    d.evict(1, 1)
    d.prefetch_arrived(1, 7)
    n = d.end_forward(info())
    assert (
        n.policy_s == pytest.approx(7e-3) and d.policy_wall_s == pytest.approx(7e-3) and d.policy_calls == 0
    )


@pytest.mark.parametrize(
    "answer, message",
    [
        (LayerDecision(to_gpu=[1], to_cpu=[], retain={1}), "split the 2 missed experts exactly"),
        (LayerDecision(to_gpu=[1], to_cpu=[1, 2], retain=set()), "split the 2 missed experts exactly"),
        (
            LayerDecision(to_gpu=[1, 2], to_cpu=[], retain={1, 2, 5, 6}),
            "retained 4 experts at layer 0, capacity 3",
        ),
        (LayerDecision(to_gpu=[1], to_cpu=[2], retain={1, 2}), "neither resident nor copied"),
    ],
)
def test_impossible_answers_are_refused(answer, message):
    d = driver(Scripted([answer]))
    d.start()
    d.begin_forward(info())
    with pytest.raises(PolicyError, match=message):
        layer(d, 0, [[1, 2]])


@pytest.mark.parametrize(
    "caps, message",
    [([2, 2, 2], "invalid capacities"), ([9, 0], "invalid capacities"), ([4, 3], "sum to 7 > 6 slots")],
)
def test_bad_capacities_are_refused(caps, message):
    d = driver(Scripted(caps=caps))
    with pytest.raises(PolicyError, match=message):
        d.start()


def test_a_static_placement_is_trimmed_to_shrunk_capacities():
    pol = Scripted(caps=[3, 3], placement=[{0, 1, 2}, {4, 5, 6}])
    d = driver(pol)
    d.start()
    assert d.begin_batch(OfflineKnowledge()) == [0, 1] and d.resident[1] == frozenset({4, 5, 6})
    pol.caps = [4, 2]
    assert d.begin_forward(info()) == [1] and d.resident[1] == frozenset({4, 5})  # the base trim: lowest ids
    assert d.mask[1].nonzero()[0].tolist() == [4, 5]


def test_a_clairvoyant_policy_needs_the_future():
    from dllm_offload_sim.policies.belady import BeladyPolicy

    d = driver(BeladyPolicy())
    assert d.needs_future
    with pytest.raises(PolicyError, match="future"):
        d.start()


def test_prefetch_arrival_and_victim_go_through_the_policy():
    class Prefetcher(NaiveLRUPolicy):
        arrived = []

        def prefetch_victim(self, layer, expert, resident, protected):
            return min(resident)

        def on_prefetch_done(self, layer, expert):
            self.arrived.append((layer, expert))

    d = driver(Prefetcher())
    d.start()
    d.set_resident(1, {1, 2, 3})
    assert not d.has_room(1) and d.prefetch_victim(1, 7) == 1
    d.evict(1, 1)
    d.prefetch_arrived(1, 7)
    assert d.resident[1] == frozenset({2, 3, 7}) and Prefetcher.arrived == [(1, 7)]


def test_the_prefetch_victim_is_the_lowest_keyed_unprotected_resident_ties_to_the_lower_id():
    """``select.lowest_unprotected`` (MoE-Infinity's and FineMoE's prefetch victim) picks what the plain rule picks:
    the resident neither planned (a mask or a priority row by expert) nor in a protected set with the smallest
    (key, id)."""
    import numpy as np

    from dllm_offload_sim.policies.select import lowest_unprotected

    rng = np.random.default_rng(7)
    for _ in range(300):
        E = int(rng.integers(4, 64))
        resident = frozenset(rng.choice(E, int(rng.integers(1, E)), replace=False).tolist())
        prot = frozenset(rng.choice(E, int(rng.integers(0, E)), replace=False).tolist())
        extra = frozenset(rng.choice(E, int(rng.integers(0, 4)), replace=False).tolist())
        key = rng.integers(0, 3, E).astype(float) * rng.choice([1.0, 0.5], E)  # many ties
        cands = [e for e in resident if e not in prot and e not in extra]
        want = min(cands, key=lambda e: (key[e], e)) if cands else None
        mask = np.zeros(E, bool)
        mask[list(prot)] = True
        priority = mask * rng.uniform(0.1, 1.0, E)  # FineMoE's plan row: nonzero where planned
        assert lowest_unprotected(resident, key, mask, extra) == want
        assert lowest_unprotected(resident, key, priority, extra, frozenset()) == want
        unplanned = [e for e in resident if e not in extra]
        assert lowest_unprotected(resident, key, None, extra) == (
            min(unplanned, key=lambda e: (key[e], e)) if unplanned else None
        )


def test_finemoes_compiled_layer_steps_add_as_numpy_does():
    """FineMoE's layer map, dot products, score, hits and best match (``policies.finemoe``'s kernels) give exactly what
    its numpy formulation gives: the same sums in the same order, so the same decisions."""
    from dllm_offload_sim.policies.finemoe import _best_match, _layer_map, _observe_kernel
    from dllm_offload_sim.policies.similarity import dots

    rng = np.random.default_rng(5)
    L, E, T, k, N = 3, 64, 16, 8, 40
    ids = np.argsort(rng.random((T, E)), axis=1)[:, :k].astype(np.int32)
    w = rng.random((T, k)).astype(np.float32)
    m = _layer_map(ids, w, E)
    assert np.array_equal(m, np.bincount(ids.ravel(), weights=w.astype(float).ravel(), minlength=E))
    store_em = rng.random((L, E, N)) * (rng.random((L, E, N)) < 0.3)
    prob, hits = rng.random((L, E)), rng.integers(0, 5, (L, E))
    active = np.unique(ids)
    missed = active[rng.random(len(active)) < 0.4]
    j, n = 1, 30
    cur, dot = np.zeros((L, E)), rng.random(N)
    want_dot, want_hits = dot.copy(), hits.copy()
    want_score = prob[j] * hits[j]
    want_hits[j, active] += 1
    want_hits[j, missed] -= 1
    want_cur = m / m.sum()
    dots(store_em[j], want_cur, n, want_dot, accumulate=True)
    score = _observe_kernel(j, m, m.sum(), cur, store_em[j], n, dot, prob, hits, active, missed)
    assert np.array_equal(cur[j], want_cur) and np.array_equal(dot, want_dot)
    assert np.array_equal(score, want_score) and np.array_equal(hits, want_hits)
    sq_cum = rng.random((N, L))
    sq_cum[3, j] = 0.0  # a stored map without mass: cosine 0
    cur_sq = float(want_cur @ want_cur)
    den = np.sqrt(sq_cum[:n, j] * cur_sq)
    cos = np.divide(dot[:n], den, out=np.zeros(n), where=den > 0)
    assert _best_match(sq_cum, j, dot, n, cur_sq) == (int(np.argmax(cos)), float(cos[np.argmax(cos)]))
    assert _best_match(sq_cum, j, np.zeros(N), n, cur_sq)[0] == 0  # all equal: the first


def test_finemoe_never_reads_a_store_slot_it_has_not_written(tmp_path):
    """FineMoE leaves its store unwritten until a map is stored there: a run whose unwritten slots hold garbage (maps
    of probability 3 everywhere, which would win every match if read; ranks of 7) decides exactly as one whose slots
    hold zeros, the store growing as maps come."""
    from dllm_offload_sim.policies.finemoe import FineMoEPolicy
    from dllm_offload_sim.sim.run import simulate
    from tests.simkit import flat_cost, random_request, tiny_topology, write_requests

    topo = tiny_topology(n_moe=3, n_experts=8)
    rng = np.random.default_rng(4)
    path = write_requests(tmp_path / "t", topo, [random_request(rng, i, topo, 9, 3) for i in range(3)])

    class Filled(FineMoEPolicy):
        def __init__(self, fill):
            super().__init__(prefetch_distance=1, store_capacity=50)
            self.fill = fill

        def _empty(self, shape, dtype=float):  # every store array, as first made and as grown
            return np.full(shape, self.fill if np.dtype(dtype).kind == "f" else 7, dtype)

    cost = flat_cost(topo, h2d_latency_s=1e-4)
    a = simulate(path, Filled(0.0), 3, cost, dummy_warmup=True)
    b = simulate(path, Filled(3.0), 3, cost, dummy_warmup=True)
    assert a.summary["prefetch_copies"] > 0  # the plans were made from stored maps
    np.testing.assert_array_equal(a.per_forward.to_numpy(), b.per_forward.to_numpy())
