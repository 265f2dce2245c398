"""The TPOT bound (sim/bound.py): no policy the engine runs is below it, it does not rise with the cache, and with
every expert's slot it is full residency's TPOT."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dllm_offload_sim.costmodel.cost_model import CostModel
from dllm_offload_sim.sim.bound import WINDOWS, tpot_bound, windows_of
from dllm_offload_sim.sim.run import simulate
from dllm_offload_sim.wiring.build import make_policy, policy_config, policy_names

from simkit import flat_profile, random_request, tiny_topology, write_requests

SHIPPED = [n for n in policy_names() if n != "full_residency"]


def _random_case(tmp_path, seed):
    rng = np.random.default_rng(seed)
    topo = tiny_topology(
        n_moe=int(rng.integers(1, 4)), n_experts=int(rng.choice([8, 16])), top_k=int(rng.integers(1, 4))
    )
    reqs = [random_request(rng, i, topo, int(rng.integers(4, 10)), int(rng.integers(1, 5))) for i in range(2)]
    path = write_requests(tmp_path / "trace", topo, reqs)
    prof = flat_profile(
        topo,
        h2d_s=float(rng.uniform(1e-4, 4e-3)),
        gpu_s=float(rng.uniform(5e-5, 1e-3)),
        cpu_per_token_s=float(rng.uniform(2e-5, 2e-3)),
        dispatch_s=float(rng.uniform(0, 3e-4)),
        h2d_latency_s=float(rng.uniform(0, 5e-5)),
        cpu_call_overhead_s=float(rng.choice([0.0, 1e-4])),
    )
    return topo, path, CostModel(prof)


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 100_000), cache_frac=st.floats(0.05, 1.0), workers=st.integers(1, 2))
def test_no_policy_is_below_the_bound(tmp_path_factory, seed, cache_frac, workers):
    topo, path, cost = _random_case(tmp_path_factory.mktemp("b"), seed)
    cache = max(1, int(round(cache_frac * topo.n_experts)))
    # every window width's bound, not only the largest, must hold
    bounds = [
        tpot_bound(path, cache, cost, dummy_warmup=True, cpu_workers=workers, widths=(w,)).tpot_ms
        for w in WINDOWS
    ]
    for name in SHIPPED:
        r = simulate(
            path, make_policy(policy_config(name)), cache, cost, dummy_warmup=True, cpu_workers=workers
        )
        t = r.summary["tpot_ms"]
        assert t >= max(bounds) * (1 - 1e-9), (name, cache, t, bounds)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 100_000))
def test_the_bound_does_not_rise_with_the_cache_and_meets_full_residency(tmp_path_factory, seed):
    topo, path, cost = _random_case(tmp_path_factory.mktemp("m"), seed)
    E = topo.n_experts
    seq = [tpot_bound(path, c, cost, dummy_warmup=True).tpot_ms for c in range(1, E + 1)]
    assert all(a >= b * (1 - 1e-12) for a, b in zip(seq, seq[1:]))
    full = simulate(path, make_policy(policy_config("full_residency")), E, cost, dummy_warmup=True).summary[
        "tpot_ms"
    ]
    assert seq[-1] == pytest.approx(full, rel=1e-9) or seq[-1] <= full


@pytest.mark.slow
@pytest.mark.parametrize("model", ["mini"])
def test_on_the_measured_profile_every_policy_is_above_the_bound_and_full_residency_meets_it(model):
    """The shipped H100 profile (bands, device curve, runtime terms) on two requests of the default trace."""
    from dllm_offload_sim.traces.shipped import default_trace_path

    cost = CostModel(f"h100-{model}")
    path, ids = default_trace_path(), [0, 1]
    full = simulate(
        path, make_policy(policy_config("full_residency")), 40, cost, requests=ids, dummy_warmup=True
    ).summary["tpot_ms"]
    assert tpot_bound(path, 256, cost, requests=ids, dummy_warmup=True).tpot_ms == pytest.approx(
        full, rel=1e-9
    )
    b20 = tpot_bound(path, 20, cost, requests=ids, dummy_warmup=True).tpot_ms
    assert b20 > 2 * full  # not the trivial bound: copies and CPU work must happen at Cache 20
    for cache in (20, 100):
        b = tpot_bound(path, cache, cost, requests=ids, dummy_warmup=True).tpot_ms
        for name in SHIPPED:
            t = simulate(
                path, make_policy(policy_config(name)), cache, cost, requests=ids, dummy_warmup=True
            ).summary["tpot_ms"]
            assert t >= b, (name, cache, t, b)


def test_windows_cover_every_forward_once_and_never_span_a_run():
    starts = np.array([True, False, False, True, False, False, False, True])
    for w in (1, 2, 3, 16):
        wins = windows_of(starts, w)
        covered = [i for lo, hi in wins for i in range(lo, hi)]
        assert covered == list(range(len(starts)))
        assert all(not starts[lo + 1 : hi].any() for lo, hi in wins)


@pytest.mark.parametrize("batch_size, dummy_warmup", [(1, True), (2, False)])
def test_the_streamed_bound_equals_the_bound_over_every_forward_at_once(tmp_path, batch_size, dummy_warmup):
    """``tpot_bound`` bounds each window as its last forward streams in, keeping a run's last 16 forwards; the same
    windows (``windows_of``) over every forward's terms at once give the same bound, to the bit."""
    from dllm_offload_sim.schedule.batch import batched_forwards
    from dllm_offload_sim.sim.bound import CallTables, forward_terms, window_arrays, window_floor
    from dllm_offload_sim.traces.reader import Trace
    from dllm_offload_sim.traces.schema import PREFILL

    rng = np.random.default_rng(11)
    topo = tiny_topology(n_moe=2, n_experts=8, top_k=2)
    reqs = [random_request(rng, i, topo, int(rng.integers(5, 40)), 3) for i in range(3)]
    path = write_requests(tmp_path / "trace", topo, reqs)
    cost = CostModel(flat_profile(topo, h2d_s=1e-3))
    tr = Trace.open(path)
    got = tpot_bound(tr, 3, cost, batch_size=batch_size, dummy_warmup=dummy_warmup)

    ids = tr.request_ids
    order = ids[:batch_size] + ids if dummy_warmup else ids
    warm = batch_size if dummy_warmup else 0
    tables, terms, starts, prev = CallTables(cost, topo.n_experts), [], [], False
    for f in batched_forwards([tr.request(r) for r in order], batch_size, topo.n_experts, warm):
        keep = f.measured and f.phase != PREFILL
        if keep:
            terms.append(forward_terms(f, cost, tables, topo.n_layers))
            starts.append(not prev)
        prev = keep
    L = topo.n_moe_layers
    totals = []
    for w in WINDOWS:
        total = 0.0
        for lo, hi in windows_of(np.asarray(starts), w):
            total += window_floor(*window_arrays(terms[lo:hi]), 0, hi - lo, L, topo.n_experts, 1e-3, 3 * L)
        totals.append(total)
    best = max(totals)
    assert got.decode_s == best and got.window == WINDOWS[totals.index(best)] and best > 0
    assert got.decoded == sum(t.decoded for t in terms)
