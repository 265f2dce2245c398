"""The compiled closed form (``sim.closed_form``) against the event engine: the same run to the bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dllm_offload_sim.policies.base import PolicyError
from dllm_offload_sim.policies.belady import BeladyPolicy
from dllm_offload_sim.policies.naive_lru import NaiveLRUPolicy
from dllm_offload_sim.policies.fiddler import FiddlerPolicy
from dllm_offload_sim.policies.ktransformers import KTransformersPolicy
from dllm_offload_sim.policies.oled import OLEDPolicy
from dllm_offload_sim.policies.tide import TIDEPolicy
from dllm_offload_sim.sim.closed_form import ExpertCallsTable
from dllm_offload_sim.sim.engine import Simulation
from dllm_offload_sim.sim.run import simulate
from tests.simkit import flat_cost
from tests.test_sim_invariants import ALL, _trace

# OLED's switches beyond the shipped rows: each takes its own branch of the fused forward (sim/fused.py)
OLED_SWITCHES = {
    "oled_ladder_base": lambda: OLEDPolicy(priority=False, adapt_interval=2),
    "oled_paper_switches": lambda: OLEDPolicy(
        confidence="current",
        stale_order="id",
        statistics="window",
        prefill_in_stats=False,
        resize_at="layer_end",
        rho="paper",
        adapt_interval=2,
        psi="square",
    ),
    "oled_load_only": lambda: OLEDPolicy(reuse_aware=False, min_capacity_frac=0.5, adapt_interval=1),
}
# switches of the other fused policies: KTransformers streaming a forward of 3 or more tokens, its uniform placement,
# TIDE refreshing at other paces, Fiddler's other objective and the split of the bound's model (clairvoyant_model)
OTHER_SWITCHES = {
    "ktransformers_streams": lambda: KTransformersPolicy(gpu_prefill_token_threshold=3),
    "ktransformers_uniform": lambda: KTransformersPolicy(placement="uniform"),
    "tide_every_forward": lambda: TIDEPolicy(jump_steps=1, refresh_first_block=False),
    "tide_every_third": lambda: TIDEPolicy(jump_steps=3),
    "fiddler_max": lambda: FiddlerPolicy(objective="max"),
    "clairvoyant_model": lambda: BeladyPolicy(dispatch="model"),
}
POLICIES = {**ALL, **OLED_SWITCHES, **OTHER_SWITCHES}
NEVER_PREFETCH = sorted(n for n, make in POLICIES.items() if not make().prefetches)
WALL = ("sim_wall_s", "sim_layer_execs_per_s", "policy_ms_per_forward", "policy_us_per_layer")


def _same(a, b):
    """Two SimResults hold the same tables, bit for bit, but for the wall-clock columns."""
    for name in a.per_forward.columns:
        np.testing.assert_array_equal(
            a.per_forward[name].to_numpy(), b.per_forward[name].to_numpy(), err_msg=name
        )
    for name in a.per_layer.columns:
        np.testing.assert_array_equal(
            a.per_layer[name].to_numpy(), b.per_layer[name].to_numpy(), err_msg=name
        )
    for k, v in a.summary.items():
        if k in WALL or k.startswith("policy_hooks"):
            continue
        assert (v == b.summary[k]) or (v != v and b.summary[k] != b.summary[k]), k


@pytest.mark.parametrize("name", NEVER_PREFETCH)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10_000),
    cache=st.integers(1, 12),
    batch=st.integers(1, 2),
    shape=st.sampled_from([(3, 8), (8, 16)]),  # rows a forward, experts a layer
    h2d_ms=st.sampled_from([0.5, 2.0, 10.0]),
    device_ms=st.sampled_from([None, 0.2, 0.9]),
    workers=st.integers(1, 3),
)
def test_a_run_that_never_prefetches_is_timed_compiled_as_the_event_engine_times_it(
    tmp_path_factory, seed, cache, batch, shape, name, h2d_ms, device_ms, workers
):
    """Every policy that never prefetches: each forward's layers decided first (in one compiled call for a fused
    policy, ``sim.fused``) and timed at once, compiled, give the tables the event engine gives deciding and timing
    each layer as it comes (``record_layers`` keeps a run on the event engine), to the bit; CPU experts, their
    contention with copies and the GPU beside them, and OLED's switches included."""
    topo, path = _trace(tmp_path_factory.mktemp("cf"), seed, n_forwards=12, rows=shape[0], n_experts=shape[1])
    cache = min(cache, topo.n_experts)
    cost = flat_cost(
        topo,
        h2d_s=h2d_ms * 1e-3,
        h2d_latency_s=1e-4,
        gpu_device_s=None if device_ms is None else device_ms * 1e-3,
    )
    cost.cpu_slowdown_beside_copies, cost.copies_slowdown_beside_cpu = 0.5, 0.3
    cost.cpu_busy_gpu_s, cost.bookkeeping_after_cpu_s, cost.cpu_issue_s = 2e-4, 3e-5, 1e-5
    run = dict(batch_size=batch, cpu_workers=workers, dummy_warmup=seed % 2 == 0)
    compiled = simulate(path, POLICIES[name](), cache, cost, **run)
    events = simulate(path, POLICIES[name](), cache, cost, record_layers=True, **run)
    _same(compiled, events)


def test_the_runs_of_one_cost_model_may_share_their_calls_table(tmp_path):
    """A table shared by several runs gives each the run it gives alone; a table of another cost model is refused."""
    topo, path = _trace(tmp_path, 3)
    cost = flat_cost(topo, h2d_latency_s=1e-4)
    shared = ExpertCallsTable(cost)
    for name in ("naive_lru", "oled", "moe_infinity"):
        _same(simulate(path, ALL[name](), 3, cost, calls=shared), simulate(path, ALL[name](), 3, cost))
    with pytest.raises(ValueError, match="another cost model"):
        Simulation(topo, None, flat_cost(topo), calls=shared)


def test_a_calls_table_trimmed_between_forwards_changes_no_result(tmp_path):
    """A table bounded to one layer shape forgets its shapes between forwards (``ExpertCallsTable.trim``) and
    computes them again: the runs are those of an unbounded table, compiled and on the event engine."""
    topo, path = _trace(tmp_path, 4)
    cost = flat_cost(topo, h2d_latency_s=1e-4)
    for name in ("naive_lru", "oled", "lfu", "moe_infinity"):
        tiny = ExpertCallsTable(cost, max_shapes=1)
        _same(simulate(path, ALL[name](), 3, cost, calls=tiny), simulate(path, ALL[name](), 3, cost))
        assert len(tiny._rows) <= 1 + topo.n_layers and len(tiny._calls) <= 1 + topo.n_layers
    with pytest.raises(ValueError, match="max_shapes"):
        ExpertCallsTable(cost, max_shapes=0)


def test_a_policy_that_plans_prefetches_must_say_so(tmp_path):
    """A policy that plans prefetches while declaring ``prefetches = False`` is stopped with a clear error (the
    compiled closed form would leave its plan unread); declaring it runs the plan."""
    topo, path = _trace(tmp_path, 5)
    cost = flat_cost(topo, h2d_latency_s=1e-4)

    class Undeclared(NaiveLRUPolicy):
        def decide(self, view):
            d = super().decide(view)
            d.prefetch = [(view.layer + 1, 0)] if view.layer + 1 < self.ctx.n_layers else None
            return d

    class Declared(Undeclared):
        prefetches = True

    with pytest.raises(PolicyError, match="declares prefetches = False"):
        simulate(path, Undeclared(), 3, cost)
    assert simulate(path, Declared(), 3, cost).summary["forwards"] > 0
