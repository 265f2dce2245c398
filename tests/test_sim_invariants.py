"""Simulator invariants on random traces: capacity, exactly-once execution, determinism, causality, bounds."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dllm_offload_sim.policies.base import ClairvoyantPolicy, Policy
from dllm_offload_sim.policies.fiddler import FiddlerPolicy
from dllm_offload_sim.policies.finemoe import FineMoEPolicy
from dllm_offload_sim.policies.full_residency import FullResidencyPolicy
from dllm_offload_sim.policies.belady import BeladyPolicy
from dllm_offload_sim.policies.belady_shared import SharedBeladyPolicy
from dllm_offload_sim.policies.ktransformers import KTransformersPolicy
from dllm_offload_sim.policies.lfu import LFUPolicy
from dllm_offload_sim.policies.lru import LRUPolicy
from dllm_offload_sim.policies.moe_infinity import MoEInfinityPolicy
from dllm_offload_sim.policies.naive_lru import NaiveLRUPolicy
from dllm_offload_sim.policies.oled import OLEDPolicy
from dllm_offload_sim.policies.tide import TIDEPolicy
from dllm_offload_sim.sim.run import simulate
from tests.simkit import flat_cost, random_request, tiny_topology, write_requests

DEPLOYABLE = {
    "lru": LRUPolicy,
    "lfu": LFUPolicy,
    "naive_lru": NaiveLRUPolicy,
    "moe_infinity": MoEInfinityPolicy,
    "finemoe": lambda: FineMoEPolicy(prefetch_distance=0),
    "ktransformers": KTransformersPolicy,
    "fiddler": FiddlerPolicy,
    "tide": lambda: TIDEPolicy(jump_steps=2),
    "oled": OLEDPolicy,
    "oled_priority": lambda: OLEDPolicy(layer_adapt=False, coop=False),
    "oled_priority_layeradapt": lambda: OLEDPolicy(coop=False, adapt_interval=2),
}
ALL = {
    **DEPLOYABLE,
    "belady": BeladyPolicy,
    "clairvoyant_coop": lambda: BeladyPolicy(dispatch="coop"),
    "belady_shared": SharedBeladyPolicy,
    "full_residency": FullResidencyPolicy,
}


def recorder(inner: Policy):
    """Wrap a policy: delegate everything, record each layer's view and decision."""
    base = ClairvoyantPolicy if isinstance(inner, ClairvoyantPolicy) else Policy

    class Recorder(base):
        name = inner.name
        needs_slots = inner.needs_slots
        shares_slots = inner.shares_slots
        prefetches = inner.prefetches

        def __init__(self):
            self.inner, self.log = inner, []

        def setup(self, ctx):
            inner.setup(ctx)
            self.ctx = inner.ctx

        def __getattr__(self, k):  # everything not defined here goes to the wrapped policy
            return getattr(inner, k)

        def capacities(self):
            return inner.capacities()

        def initial_residency(self):
            return inner.initial_residency()

        def begin_batch(self, kn):
            return inner.begin_batch(kn)

        def begin_forward(self, fwd):
            inner.begin_forward(fwd)

        def forward_prefetch(self, fwd):
            return inner.forward_prefetch(fwd)

        def trim(self, layer, resident, cap):
            return inner.trim(layer, resident, cap)

        def prefetch_victim(self, *a):
            return inner.prefetch_victim(*a)

        def on_prefetch_done(self, *a):
            inner.on_prefetch_done(*a)

        def end_forward(self, fwd):
            inner.end_forward(fwd)

        def bind_future(self, oracle):
            inner.bind_future(oracle)

        def decide(self, view):
            d = inner.decide(view)
            self.log.append((view.forward.index, view.layer, view, d))
            return d

    return Recorder()


def _trace(tmp_path, seed, n_requests=2, n_forwards=9, rows=3, n_moe=2, n_experts=8):
    topo = tiny_topology(n_moe=n_moe, n_experts=n_experts)
    rng = np.random.default_rng(seed)
    reqs = [random_request(rng, i, topo, n_forwards, rows) for i in range(n_requests)]
    return topo, write_requests(tmp_path / "trace", topo, reqs)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10_000),
    cache=st.integers(1, 6),
    batch=st.integers(1, 2),
    name=st.sampled_from(sorted(ALL)),
)
def test_capacity_and_exactly_once(tmp_path_factory, seed, cache, batch, name):
    topo, path = _trace(tmp_path_factory.mktemp("inv"), seed)
    pol = recorder(ALL[name]())
    r = simulate(path, pol, cache, flat_cost(topo, h2d_latency_s=1e-4), batch_size=batch)
    assert pol.log, "the policy was never asked"
    for f, j, view, d in pol.log:
        assert len(view.resident) <= view.capacity
        if (
            not pol.shares_slots
        ):  # (a shared pool's capacities move with each decision: the driver checks them)
            assert len(d.retain) <= view.capacity
        active = set(view.active.tolist())
        hits = active & view.resident
        missed = set(view.missed.tolist())
        assert hits | missed == active and not hits & missed
        assert sorted(list(d.to_gpu) + list(d.to_cpu)) == sorted(missed)  # each miss handled exactly once
    caps = np.asarray(pol.capacities())
    assert caps.sum() <= pol.ctx.total_slots
    s = r.summary
    assert s["hits"] + s["demand_copies"] + s["cpu_experts"] == s["activations"]


@pytest.mark.parametrize("name", sorted(ALL))
def test_deterministic(tmp_path, name):
    topo, path = _trace(tmp_path, 3)
    a = simulate(path, ALL[name](), 3, flat_cost(topo, h2d_latency_s=1e-4))
    b = simulate(path, ALL[name](), 3, flat_cost(topo, h2d_latency_s=1e-4), record_schedule=True)
    assert b.schedule and a.schedule is None  # recording the schedule (for the GPU replay) changes nothing
    wall = {
        "sim_wall_s",
        "sim_layer_execs_per_s",
        "policy_ms_per_forward",
        "policy_us_per_layer",
        "policy_hooks_us_per_forward",
    }
    import pandas as pd

    sa = pd.Series({k: v for k, v in a.summary.items() if k not in wall})
    sb = pd.Series({k: v for k, v in b.summary.items() if k not in wall})
    assert sa.equals(sb)  # NaN-aware
    assert a.per_forward.equals(b.per_forward) and a.per_layer.equals(b.per_layer)


def _perturbed(req, step, layer, rng, n_experts):
    """A copy of ``req`` whose routing after (step, layer) and confidence from ``step`` on are random."""
    b = copy.deepcopy(req)
    rows = slice(int(b.row_offset[step]), None)
    k = b.ids.shape[2]
    fresh = np.stack(
        [
            np.stack([rng.choice(n_experts, k, replace=False) for _ in range(b.ids.shape[1])])
            for _ in range(b.ids.shape[0])
        ]
    ).astype(np.int16)
    later = slice(int(b.row_offset[step + 1]), None)
    b.ids[later] = fresh[later]
    b.ids[rows, layer + 1 :] = fresh[rows, layer + 1 :]
    b.weights[later] = rng.random(b.weights[later].shape)
    b.confidence[rows] = rng.random(b.confidence[rows].shape)
    return b


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10_000),
    cut_step=st.integers(1, 7),
    cut_layer=st.integers(0, 2),
    name=st.sampled_from(sorted(DEPLOYABLE)),
)
def test_causality(tmp_path_factory, seed, cut_step, cut_layer, name):
    """Changing the trace after (forward i, layer l) never changes decisions up to that point."""
    topo = tiny_topology(n_moe=3)
    rng = np.random.default_rng(seed)
    req = random_request(rng, 0, topo, 9, 3)
    d = tmp_path_factory.mktemp("causal")
    pa = write_requests(d / "a", topo, [req])
    pb = write_requests(d / "b", topo, [_perturbed(req, cut_step, cut_layer, rng, topo.n_experts)])
    cost = flat_cost(topo, h2d_latency_s=1e-4)
    ra, rb = recorder(DEPLOYABLE[name]()), recorder(DEPLOYABLE[name]())
    simulate(pa, ra, 3, cost)
    simulate(pb, rb, 3, cost)

    def upto(log):
        pf = lambda p: None if p is None else np.asarray(p, np.int64).reshape(-1, 2).tolist()  # noqa: E731
        return [
            (f, j, list(x.to_gpu), list(x.to_cpu), sorted(x.retain), pf(x.prefetch))
            for f, j, _, x in log
            if (f, j) <= (cut_step, cut_layer)
        ]

    assert upto(ra.log) == upto(rb.log)


# Non-prefetching policies with uniform per-layer capacity that start, like ``belady``, from an empty
# cache (KTransformers and Fiddler pin a placement before the run, which is a warm start).
NON_PREFETCHING_UNIFORM = {
    "lru": LRUPolicy,
    "lfu": LFUPolicy,
    "naive_lru": NaiveLRUPolicy,
    "tide": TIDEPolicy,
    "oled_priority": lambda: OLEDPolicy(layer_adapt=False, coop=False),
    "oled_coop": lambda: OLEDPolicy(layer_adapt=False),
}


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), cache=st.integers(1, 6))
def test_belady_has_fewest_demand_misses(tmp_path_factory, seed, cache):
    topo, path = _trace(tmp_path_factory.mktemp("bound"), seed, n_requests=1, n_forwards=12)
    cost = flat_cost(topo, h2d_latency_s=1e-4)
    best = simulate(path, BeladyPolicy(), cache, cost).summary
    ideal_misses = best["activations"] - best["hits"]
    for name, make in NON_PREFETCHING_UNIFORM.items():
        s = simulate(path, make(), cache, cost).summary
        assert ideal_misses <= s["activations"] - s["hits"], name


TRANSFER_POLICIES = {
    "lru": LRUPolicy,
    "lfu": LFUPolicy,
    "naive_lru": NaiveLRUPolicy,
    "oled_priority": lambda: OLEDPolicy(layer_adapt=False, coop=False),
    "moe_infinity": MoEInfinityPolicy,
    "finemoe": FineMoEPolicy,
    "belady": BeladyPolicy,
}


@pytest.mark.parametrize("name", sorted(TRANSFER_POLICIES))
def test_unbounded_bandwidth_converges_to_full_residency(tmp_path, name):
    topo, path = _trace(tmp_path, 5)
    full = simulate(path, FullResidencyPolicy(), 2, flat_cost(topo)).summary["tpot_ms"]
    gaps = []
    for gbps in (1.0, 1e3, 1e6, 1e9):
        from dllm_offload_sim.costmodel.cost_model import CostModel
        from tests.simkit import flat_profile

        cm = CostModel(flat_profile(topo), pcie_gbps=gbps)
        gaps.append(simulate(path, TRANSFER_POLICIES[name](), 2, cm).summary["tpot_ms"] - full)
    assert all(g >= -1e-9 for g in gaps)
    assert gaps == sorted(gaps, reverse=True)
    assert gaps[-1] == pytest.approx(0.0, abs=1e-6 * full)


def test_single_request_forwards_equal_the_general_batching(tmp_path):
    """Batch size 1 builds a request's forwards with whole-request numpy operations; every field equals
    the per-forward construction used for larger batches."""
    from dllm_offload_sim.traces.reader import Trace
    from dllm_offload_sim.traces.shipped import DEFAULT_TRACE, shipped_trace_path

    topo, path = _trace(tmp_path, 3)
    tr = Trace.open(path)
    real = Trace.open(shipped_trace_path(DEFAULT_TRACE))  # prompt-length prefill, denoise and commit forwards
    _compare_batching([tr.request(r) for r in tr.request_ids], topo)
    _compare_batching([real.request(0)], real.topology)


def _compare_batching(reqs, topo):
    from dllm_offload_sim.schedule.batch import batched_forwards

    fast = list(batched_forwards(reqs, 1, topo.n_experts, warmup_requests=1))
    slow = []
    for b, r in enumerate(reqs):  # batch_size 2 over a one-request list takes the general path
        for f in batched_forwards([r], 2, topo.n_experts):
            f.index, f.batch, f.measured = len(slow), b, b >= 1
            slow.append(f)
    assert len(fast) == len(slow)
    for a, b in zip(fast, slow):
        for name in ("index", "batch", "phase", "n_tokens", "kv_len", "block_start", "decoded", "measured"):
            assert getattr(a, name) == getattr(b, name), name
        for name in ("ids", "weights", "counts", "masked", "ids_by_layer", "weights_by_layer", "_es", "_tok"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
        np.testing.assert_array_equal(a.prev_confidence, b.prev_confidence)
        assert a._cut == b._cut
        for j in range(topo.n_moe_layers):
            np.testing.assert_array_equal(a.active(j), b.active(j))
            assert a.ids_by_layer[j].flags.c_contiguous


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), cache=st.integers(1, 6))
def test_the_shared_pool_bound_misses_least(tmp_path_factory, seed, cache):
    """Belady over one pool of Cache x layers slots misses no more than per-layer Belady, nor any policy that
    fills its cache only with what layers activate (demand policies, layer-adaptive OLED included) within
    the same total slots."""
    topo, path = _trace(tmp_path_factory.mktemp("sh"), seed)
    cost = flat_cost(topo, h2d_latency_s=1e-4)

    def misses(pol):
        s = simulate(path, pol, cache, cost).summary
        return s["activations"] - s["hits"]

    shared = misses(SharedBeladyPolicy())
    for name in ("belady", "lru", "naive_lru", "lfu", "oled", "oled_priority", "oled_priority_layeradapt"):
        assert shared <= misses(ALL[name]()), name


def test_static_placements_are_copied_and_the_dummy_warmup_is_the_same_for_every_policy(tmp_path):
    """KTransformers' hot experts are copied like any other expert (counted, and before the batch starts);
    with the dummy warm-up the first batch is replayed once unmeasured, so the placement is paid there."""
    topo, path = _trace(tmp_path, 11)
    cost = flat_cost(topo, h2d_latency_s=1e-4)
    cold = simulate(path, KTransformersPolicy(), 3, cost, batch_size=1)
    s = cold.summary
    assert s["placement_copies"] > 0
    assert s["h2d_count"] == s["demand_copies"] + s["prefetch_copies"] + s["placement_copies"]
    assert s["h2d_gb"] == pytest.approx(s["h2d_count"] * topo.expert_bytes / 1e9)
    warm = simulate(path, KTransformersPolicy(), 3, cost, batch_size=1, dummy_warmup=True)
    assert warm.summary["forwards"] == s["forwards"]  # the warm-up forwards are not measured
    assert len(warm.per_forward) > len(cold.per_forward) and not warm.per_forward.measured.iloc[0]
    naive_cold = simulate(path, NaiveLRUPolicy(), 3, cost).per_forward
    naive_warm = simulate(path, NaiveLRUPolicy(), 3, cost, dummy_warmup=True).per_forward
    assert naive_cold.hits.iloc[0] == 0 and naive_warm[naive_warm.measured].hits.iloc[0] > 0


def test_the_cpu_dispatch_cost_is_the_layers_token_rows():
    """OLED's split and clairvoyant_coop's estimate the CPU dispatch from the layer's token rows, as the
    simulator charges it, not from the routed (token, expert) pairs."""
    from dllm_offload_sim.policies.base import CostHints
    from dllm_offload_sim.policies.dispatch import cooperative_dispatch

    asked = []
    hints = CostHints(1e-3, lambda n: 1e-4 * n, lambda n: asked.append(n) or 0.0, lambda e, t: 0.0)
    cooperative_dispatch([1, 2, 3], [4, 5, 6], [0.2, 0.3, 0.5], hints, 0.5, 3, token_rows=7)
    assert asked == [7]


def _admit_one_by_one(resident, transferred, executing, capacity, score):
    """The admission rule written out step by step (the reference for ``select.admit``)."""
    cache = set(resident)
    evictable = sorted((e for e in cache if e not in executing), key=lambda e: (score[e], e))
    for e in transferred:
        if e in cache:
            continue
        if len(cache) >= capacity:
            if not evictable:
                continue
            cache.discard(evictable.pop(0))
        cache.add(e)
    return cache


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_admission_equals_admitting_one_by_one(data):
    """``admit`` (closed form when no transferred expert is resident) keeps the caches of the one-by-one rule:
    free slots first, then evictions of the lowest score (ties to the lower id) among non-executing residents,
    then bypass; overfull caches, duplicates and re-admitted residents included."""
    from dllm_offload_sim.policies.select import admit

    E = 16
    resident = data.draw(st.sets(st.integers(0, E - 1), max_size=E))
    transferred = data.draw(st.lists(st.integers(0, E - 1), max_size=E))
    executing = data.draw(st.sets(st.integers(0, E - 1), max_size=E))
    capacity = data.draw(st.integers(0, E))
    score = np.array(data.draw(st.lists(st.integers(0, 3), min_size=E, max_size=E)), float)
    assert admit(resident, transferred, executing, capacity, score) == _admit_one_by_one(
        resident, transferred, executing, capacity, score
    )
