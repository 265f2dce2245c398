"""A layer's timeline: the closed form and the event path are one function and give the same times."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dllm_offload_sim.sim.run import simulate
from dllm_offload_sim.schedule.timeline import ExpertCalls, expert_calls_end
from tests.simkit import flat_cost
from tests.test_sim_invariants import ALL, _trace


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10_000),
    cache=st.integers(1, 6),
    batch=st.integers(1, 2),
    name=st.sampled_from(sorted(ALL)),
    h2d_ms=st.sampled_from([0.5, 2.0, 10.0]),
    device_ms=st.sampled_from([None, 0.2, 0.9]),
)
def test_closed_form_equals_the_event_path(tmp_path_factory, seed, cache, batch, name, h2d_ms, device_ms):
    """Every forward takes the same time and counts the same whether idle layers are timed in closed form or
    as events (only float rounding of summed timeouts may differ)."""
    topo, path = _trace(tmp_path_factory.mktemp("tl"), seed)
    cost = flat_cost(
        topo,
        h2d_s=h2d_ms * 1e-3,
        h2d_latency_s=1e-4,
        gpu_device_s=None if device_ms is None else device_ms * 1e-3,
    )
    a = simulate(path, ALL[name](), cache, cost, batch_size=batch, closed_form=True)
    b = simulate(path, ALL[name](), cache, cost, batch_size=batch, closed_form=False)
    counters = ["forward", "hits", "misses", "to_gpu", "to_cpu", "prefetch_copies"]
    assert a.per_forward[counters].equals(b.per_forward[counters])
    np.testing.assert_allclose(a.per_forward.duration_s, b.per_forward.duration_s, rtol=1e-9, atol=1e-12)
    assert a.summary["tpot_ms"] == pytest.approx(b.summary["tpot_ms"], rel=1e-9)


def test_expert_calls_without_copies_end_after_the_hits_call():
    calls = ExpertCalls(hit=(3.0, 2.0))
    assert calls.end(10.0, float("nan")) == 13.0


@pytest.mark.parametrize("copies_s", [0.5, 4.0, 20.0])
def test_expert_calls_end_is_the_rule_it_planned(copies_s):
    hit, copied, both = (3.0, 2.0), (2.5, 1.5), (4.0, 3.0)
    calls = ExpertCalls.plan(hit, copied, both, copies_s)
    arrive = calls.copies_land_when_idle(1.0)
    assert arrive == 1.0 + calls.copies_wait_s + copies_s
    assert calls.end(1.0, arrive) == expert_calls_end(1.0, arrive, calls.together, hit, copied, both)
    # the plan takes whichever order ends sooner on an idle copy engine
    one = expert_calls_end(0.0, copies_s, True, hit, copied, both)
    two = expert_calls_end(0.0, (hit[0] - hit[1]) + copies_s, False, hit, copied, both)
    assert calls.together == (one < two) and calls.end(0.0, calls.copies_land_when_idle(0.0)) == min(one, two)
