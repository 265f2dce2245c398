"""Cooperative dispatch (OLED-MoE §4.4) and OLED's per-layer kernel, checked against their definitions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_offload_sim.costmodel import CostModel
from dllm_offload_sim.policies.base import CostHints
from dllm_offload_sim.policies.dispatch import cooperative_dispatch, split_misses
from dllm_offload_sim.policies.jit import INSERTION_SORT_MAX, stable_argsort
from dllm_offload_sim.policies.oled import oled_constants, oled_layer

ROOT = Path(__file__).resolve().parents[1]


def objective(in_gpu, priority, cpu_cost, fixed, h2d, workers, lam) -> float:
    """J = max(H2D path, CPU path) - lam * (priority sent to the GPU), as the module docstring defines it."""
    n_g, m = int(in_gpu.sum()), len(in_gpu)
    c_path = fixed + cpu_cost[~in_gpu].sum() / workers if n_g < m else 0.0
    return max(n_g * h2d, c_path) - lam * priority[in_gpu].sum()


def stage_one(priority, rho) -> np.ndarray:
    """The highest-priority round(rho * m) misses (equal priorities: lower index first)."""
    m = len(priority)
    top = sorted(range(m), key=lambda i: (-priority[i], i))[: int(round(rho * m))]
    mask = np.zeros(m, bool)
    mask[top] = True
    return mask


misses = st.integers(1, 24).flatmap(
    lambda m: st.tuples(
        st.lists(
            st.sampled_from([0.0, 0.01, 0.02, 0.05, 0.1, 0.3]), min_size=m, max_size=m
        ),  # ties on purpose
        st.lists(st.floats(1e-5, 2e-3), min_size=m, max_size=m),
    )
)


@settings(max_examples=300, deadline=None)
@given(misses, st.floats(0, 1), st.integers(0, 4))
def test_stage_one_is_the_top_priorities(pc, rho, shift):
    prio, cost = map(np.asarray, pc)
    got = split_misses(prio, cost, 1e-4, 5e-4, 1, rho, 40, 0.5, 0, shift)
    assert got.tolist() == stage_one(prio, rho).tolist()


@settings(max_examples=300, deadline=None)
@given(misses, st.floats(0, 1), st.integers(1, 4), st.integers(0, 2), st.integers(1, 3), st.floats(0, 2))
def test_swaps_only_lower_the_objective_and_stay_near_the_split(pc, rho, swaps, shift, workers, reuse_weight):
    prio, cost = map(np.asarray, pc)
    fixed, h2d, n_active = 1e-4, 5e-4, 40
    lam = reuse_weight * h2d * n_active
    start = stage_one(prio, rho)
    got = split_misses(prio, cost, fixed, h2d, workers, rho, n_active, reuse_weight, swaps, shift)
    j0 = objective(start, prio, cost, fixed, h2d, workers, lam)
    j1 = objective(got, prio, cost, fixed, h2d, workers, lam)
    assert j1 <= j0 + 1e-12
    assert abs(int(got.sum()) - int(start.sum())) <= shift
    # only the candidate pools move: the N_CANDIDATES lowest-priority GPU and costliest CPU experts, per swap
    assert int((got != start).sum()) <= 2 * swaps


def test_costly_cpu_expert_is_swapped_or_moved_to_the_gpu():
    # two misses, 1 ms per copy, rho = 0.5: stage 1 copies the higher-priority expert 0, expert 1 (10 ms) runs
    # on the CPU: J = max(1, 10) ms. Swapping them gives max(1, 1) ms, copying both 2 ms: the swap wins.
    got = split_misses(np.array([0.6, 0.4]), np.array([1e-3, 1e-2]), 0.0, 1e-3, 1, 0.5, 2, 0.0, 4, 1)
    assert got.tolist() == [False, True]
    # expert 0 costs 5 ms on the CPU: the swap gives 5 ms, copying both 2 ms: both go to the GPU
    got = split_misses(np.array([0.6, 0.4]), np.array([5e-3, 1e-2]), 0.0, 1e-3, 1, 0.5, 2, 0.0, 4, 1)
    assert got.tolist() == [True, True]
    # a cheap CPU expert: 1 ms || 0.5 ms is already the best split, nothing moves
    got = split_misses(np.array([0.6, 0.4]), np.array([1e-3, 5e-4]), 0.0, 1e-3, 1, 0.5, 2, 0.0, 4, 1)
    assert got.tolist() == [True, False]


def test_list_api_keeps_ids_and_order():
    costs = CostHints.constant(h2d=1e-3, cpu_per_token=1e-3)
    to_gpu, to_cpu = cooperative_dispatch([3, 7, 9], [1, 30, 2], [0.5, 0.2, 0.3], costs, 1 / 3, 10, 0.0, 4, 1)
    assert sorted(to_gpu + to_cpu) == [3, 7, 9]
    assert to_gpu == sorted(to_gpu) and to_cpu == sorted(to_cpu)
    assert 7 in to_gpu  # 30 tokens on the CPU cost 30 ms against 1 ms per copy


def _layer_inputs(rng, E=64, T=12, k=4, n_resident=20):
    ids = np.array([rng.choice(E, k, replace=False) for _ in range(T)], np.int64)
    w = rng.random((T, k)).astype(np.float32)
    psi = rng.random(T).astype(np.float32)
    active, tokens = np.unique(ids, return_counts=True)
    resident = rng.choice(E, n_resident, replace=False)
    is_miss = ~np.isin(active, resident)
    return ids, w, psi, active, active[is_miss], tokens[is_miss].astype(np.int64), set(resident.tolist())


def _n_bar(profiled=float("nan")):
    """OLED's n-bar state: no missed experts' tokens seen yet, and the profiled value (NaN: none)."""
    return np.array([0.0, 0.0, profiled])


def _mask(E, experts):
    m = np.zeros(E, np.bool_)
    m[list(experts)] = True
    return m


@pytest.mark.parametrize("seed", range(5))
def test_oled_layer_keeps_the_most_recent_stale_residents_in_the_room_left(seed):
    """An overflowing layer whose active experts on the GPU leave slots: after them, the residents not active now,
    most recently used first, ties to the lower id (what ``select.keep_top_by`` orders by), as many as fit."""
    rng = np.random.default_rng(seed)
    E, L, j, fwd = 64, 2, 0, 9
    ids, w, psi, active, missed, mtok, resident = _layer_inputs(rng, E, T=3, k=4, n_resident=30)
    cap = len(resident)  # the misses overflow it, while the few active experts leave most of it
    prio, stats = np.zeros((L, E)), np.full((2, L), np.nan)
    last = np.full((L, E), -1, np.int64)
    last[j] = rng.integers(0, 4, E)  # few values: ties between stale residents
    k = oled_constants(
        h2d_s=0.0,
        cpu_workers=0,
        reuse_aware=True,
        reuse_weight=0.0,
        max_swaps=0,
        max_shift=0,
        by_priority=True,
        adapt=False,
        smoothing=0.5,
        n_experts=E,
    )
    cpu_s, disp_s = CostHints.constant().cost_arrays(ids.size)
    out, n_gpu = oled_layer(
        j,
        ids,
        w,
        psi,
        active,
        missed,
        mtok,
        prio,
        last,
        stats,
        fwd,
        cap,
        len(resident),
        _mask(E, resident),
        False,
        _n_bar(),
        cpu_s,
        disp_s,
        k,
    )
    out, m = out.tolist(), len(missed)
    assert n_gpu == m and len(resident) + n_gpu > cap and len(active) < cap
    stale = sorted(resident - set(active.tolist()))
    want = sorted(stale, key=lambda e: (-last[j, e], e))[: cap - len(active)]
    assert out[m : m + len(active)] and set(out[m : m + len(active)]) == set(active.tolist())
    assert out[m + len(active) :] == want and len(out) - m == cap


@pytest.mark.parametrize("seed", range(5))
def test_oled_layer_matches_its_definition(seed):
    rng = np.random.default_rng(seed)
    E, L, j, fwd, cap = 64, 3, 1, 7, 16
    ids, w, psi, active, missed, mtok, resident = _layer_inputs(rng, E)
    prio, last, stats = np.zeros((L, E)), np.full((L, E), -1, np.int64), np.full((2, L), np.nan)
    k = oled_constants(
        h2d_s=0.0,
        cpu_workers=0,
        reuse_aware=True,
        reuse_weight=0.0,
        max_swaps=0,
        max_shift=0,
        by_priority=False,
        adapt=False,
        smoothing=0.5,
        n_experts=0,
    )
    cm = CostModel("h200-mini")
    cpu_s, disp_s = CostHints.from_cost_model(cm).cost_arrays(ids.size)
    # without coop every miss is copied; retention by priority (BY_PRIORITY off here: checked below)
    mask = _mask(E, resident)
    out, n_gpu = oled_layer(
        j,
        ids,
        w,
        psi,
        active,
        missed,
        mtok,
        prio,
        last,
        stats,
        fwd,
        cap,
        len(resident),
        mask,
        False,
        _n_bar(),
        cpu_s,
        disp_s,
        k,
    )
    ref = np.bincount(ids.ravel(), weights=(w * psi[:, None]).ravel(), minlength=E)
    assert prio[j].tolist() == ref.tolist()  # bit for bit: same accumulation order as np.bincount
    assert not prio[0].any() and not prio[2].any()
    assert (last[j, active] == fwd).all() and (np.delete(last[j], active) == -1).all()
    assert n_gpu == len(missed) and out.tolist() == missed.tolist()

    # retention by priority: the top min(cap, |active| - |to_cpu|) active experts by (priority desc, id asc)
    k["by_priority"] = True
    k["h2d_s"] = cpu_s[1]  # the split at a profiled n-bar of 1 token: rho = 0.5
    out, n_gpu = oled_layer(
        j,
        ids,
        w,
        psi,
        active,
        missed,
        mtok,
        prio,
        last,
        stats,
        fwd,
        cap,
        len(resident),
        mask,
        True,
        _n_bar(1.0),
        cpu_s,
        disp_s,
        k,
    )
    out = out.tolist()
    m = len(missed)
    to_cpu = set(out[n_gpu:m])
    on_gpu = [e for e in active.tolist() if e not in to_cpu]
    want = sorted(on_gpu, key=lambda e: (-ref[e], e))[: min(cap, len(on_gpu))]
    if len(resident) + n_gpu > cap:
        assert out[m:] == want
    else:
        assert out[m:] == []


@pytest.mark.parametrize("seed", range(5))
def test_oled_layer_keeps_every_active_gpu_expert_where_they_fit(seed):
    """An overflowing layer whose capacity holds every active expert on the GPU: all of them stay, without a ranking
    (in id order), the CPU experts do not, and the stale residents most recently used fill the room left."""
    rng = np.random.default_rng(seed)
    E, L, j, fwd = 64, 2, 0, 9
    ids, w, psi, active, missed, mtok, resident = _layer_inputs(rng, E, T=6, k=4, n_resident=40)
    k = oled_constants(
        h2d_s=0.0,
        cpu_workers=0,
        reuse_aware=True,
        reuse_weight=0.0,
        max_swaps=0,
        max_shift=0,
        by_priority=True,
        adapt=False,
        smoothing=0.5,
        n_experts=E,
    )
    cm = CostModel("h200-mini")
    cpu_s, disp_s = CostHints.from_cost_model(cm).cost_arrays(ids.size)
    k["h2d_s"] = cpu_s[1]  # rho = 0.5: some misses run on the CPU
    last0 = np.full((L, E), -1, np.int64)
    last0[j] = rng.integers(0, 4, E)

    def run(cap):
        prio, last, stats = np.zeros((L, E)), last0.copy(), np.full((2, L), np.nan)
        out, n_gpu = oled_layer(
            j,
            ids,
            w,
            psi,
            active,
            missed,
            mtok,
            prio,
            last,
            stats,
            fwd,
            cap,
            len(resident),
            _mask(E, resident),
            True,
            _n_bar(1.0),
            cpu_s,
            disp_s,
            k,
        )
        return out.tolist(), n_gpu

    m = len(missed)
    out, n_gpu = run(len(active))  # the split does not depend on the capacity
    to_cpu = out[n_gpu:m]
    on_gpu = [e for e in active.tolist() if e not in set(to_cpu)]
    stale = sorted(resident - set(active.tolist()), key=lambda e: (-last0[j, e], e))
    room = min(len(stale), 3)
    cap = len(on_gpu) + room
    assert to_cpu and len(resident) + n_gpu > cap  # the layer overflows, and some experts run on the CPU
    out, n_gpu2 = run(cap)
    assert n_gpu2 == n_gpu and out[n_gpu:m] == to_cpu
    assert out[m : m + len(on_gpu)] == on_gpu  # all of them, in id order
    assert out[m + len(on_gpu) :] == stale[:room]


def test_oled_adaptive_stats_are_smoothed():
    rng = np.random.default_rng(0)
    E, L = 64, 2
    ids, w, psi, active, missed, mtok, resident = _layer_inputs(rng, E)
    prio, last, stats = np.zeros((L, E)), np.full((L, E), -1, np.int64), np.full((2, L), np.nan)
    k = oled_constants(
        h2d_s=0.0,
        cpu_workers=0,
        reuse_aware=False,
        reuse_weight=0.0,
        max_swaps=0,
        max_shift=0,
        by_priority=False,
        adapt=True,
        smoothing=0.25,
        n_experts=E,
    )
    cpu_s, disp_s = CostHints.constant().cost_arrays(ids.size)
    a, u = len(active) / E, (len(active) - len(missed)) / 10
    none = np.zeros(E, np.bool_)
    oled_layer(
        0,
        ids,
        w,
        psi,
        active,
        missed,
        mtok,
        prio,
        last,
        stats,
        0,
        10,
        0,
        none,
        False,
        _n_bar(),
        cpu_s,
        disp_s,
        k,
    )
    assert stats[:, 0].tolist() == [a, u] and np.isnan(stats[:, 1]).all()
    oled_layer(
        0,
        ids,
        w,
        psi,
        active,
        missed[:0],
        mtok[:0],
        prio,
        last,
        stats,
        1,
        10,
        0,
        none,
        False,
        _n_bar(),
        cpu_s,
        disp_s,
        k,
    )
    assert stats[:, 0].tolist() == [a, 0.75 * u + 0.25 * (len(active) / 10)]


def test_same_decisions_without_the_compiler(small_trace, tmp_path):
    """NUMBA_DISABLE_JIT=1 runs the kernels as Python: the simulation must not change."""
    script = (
        "import json, sys; from dllm_offload_sim.costmodel import CostModel; from dllm_offload_sim.policies.oled import OLEDPolicy; "
        "from dllm_offload_sim.sim.run import simulate; r = simulate(sys.argv[1], OLEDPolicy(), 30, CostModel('h200-mini')); "
        "print(json.dumps({k: v for k, v in r.summary.items() if 'wall' not in k and 'policy_' not in k "
        "and 'per_s' not in k}, default=str))"
    )
    runs = {}
    for jit in ("0", "1"):
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "NUMBA_DISABLE_JIT": jit, "PYTHONPATH": path}
        p = subprocess.run(
            [sys.executable, "-c", script, str(small_trace)],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=600,
        )
        assert p.returncode == 0, p.stderr[-2000:]
        runs[jit] = json.loads(p.stdout.strip().splitlines()[-1])
    assert runs["0"] == runs["1"]
    assert runs["0"]["tpot_ms"] > 0


def test_the_kernels_rounding_of_n_bar_is_pythons():
    """The split's token count (in ``hardware_split`` and OLED's kernel alike) rounds n-bar as Python's ``round``
    does (halves to the even integer), at least 1."""
    from dllm_offload_sim.policies.dispatch import rounded_tokens

    for x in (0.5, 1.5, 2.5, 3.49999, 3.5, 3.50001, 7.0, 12.5, 1.0 / 3, 2.0 / 3, 1e-9):
        assert rounded_tokens(x) == max(1, round(x)), x


@pytest.mark.parametrize("seed", range(3))
def test_oled_layer_splits_at_the_running_n_bar_as_hardware_split_does(seed):
    """Without a profiled n-bar, a cooperative layer adds its misses' tokens to the running mean and copies
    round(rho x misses) of them (no swaps), rho being ``hardware_split`` at that mean."""
    from dllm_offload_sim.policies.dispatch import hardware_split

    rng = np.random.default_rng(seed)
    E, L = 64, 2
    hints = CostHints.from_cost_model(CostModel("h200-mini"))
    k = oled_constants(
        h2d_s=hints.expert_h2d_s,
        cpu_workers=1,
        reuse_aware=True,
        reuse_weight=0.0,
        max_swaps=0,
        max_shift=0,
        by_priority=False,
        adapt=False,
        smoothing=0.5,
        n_experts=E,
    )
    prio, last, stats = np.zeros((L, E)), np.full((L, E), -1, np.int64), np.full((2, L), np.nan)
    n_bar, seen = _n_bar(), []
    for fwd in range(3):
        ids, w, psi, active, missed, mtok, resident = _layer_inputs(rng, E, T=int(rng.integers(2, 24)))
        cpu_s, disp_s = hints.cost_arrays(ids.size)
        out, n_gpu = oled_layer(
            0,
            ids,
            w,
            psi,
            active,
            missed,
            mtok,
            prio,
            last,
            stats,
            fwd,
            64,
            len(resident),
            _mask(E, resident),
            True,
            n_bar,
            cpu_s,
            disp_s,
            k,
        )
        seen += mtok.tolist()
        assert n_bar[:2].tolist() == [sum(seen), len(seen)]
        assert n_gpu == int(round(hardware_split(hints, sum(seen) / len(seen)) * len(missed)))


@given(
    st.lists(
        st.sampled_from([0.0, -0.0, 0.25, 0.5, 1.0, np.inf, -np.inf]) | st.floats(-1, 1, width=32),
        max_size=INSERTION_SORT_MAX + 40,
    )
)
@settings(max_examples=200, deadline=None)
def test_stable_argsort_is_numpys_stable_argsort(keys):
    # ties (and -0.0 against 0.0) keep their order, on both sides of the insertion-sort length
    a = np.asarray(keys, np.float64)
    np.testing.assert_array_equal(stable_argsort(a), np.argsort(a, kind="stable"))


@pytest.mark.parametrize("n", [0, 1, INSERTION_SORT_MAX, INSERTION_SORT_MAX + 1, 3 * INSERTION_SORT_MAX])
def test_stable_argsort_keeps_ties_in_order_at_every_length(n):
    a = np.random.default_rng(n).integers(0, 5, n).astype(np.float64)  # many ties
    np.testing.assert_array_equal(stable_argsort(a), np.argsort(a, kind="stable"))
