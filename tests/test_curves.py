"""``policies.curves``: the grouped-GPU-call curve as arrays, evaluated in a kernel, against the cost model's own;
and ``clairvoyant_model``'s split, which decides by it, against its reference."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_offload_sim.costmodel.cost_model import CostModel
from dllm_offload_sim.costmodel.profile import load_profile
from dllm_offload_sim.policies.base import CostHints
from dllm_offload_sim.policies.belady import NEVER, model_split
from dllm_offload_sim.policies.curves import gpu_call_seconds


def _profile(tmp_path, experts: list[int]):
    """The shipped h100-mini profile with its GPU call measured at ``experts`` only (a subset of its grid)."""
    d = load_profile("h100-mini").to_dict()
    g = d["gpu_experts"]
    g["seconds"] = [g["seconds"][g["experts"].index(x)] for x in experts]
    g["experts"] = experts
    f = tmp_path / "p.json"
    f.write_text(json.dumps(d))
    return CostModel(str(f))


@pytest.mark.parametrize("experts", [[1, 2, 4, 8, 16, 32, 64, 128, 256], [1, 4, 16], [8]])
@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 300), per_expert=st.floats(0.0, 400.0))
def test_the_compiled_gpu_call_is_the_cost_models_to_the_bit(tmp_path_factory, experts, n, per_expert):
    """Within the largest measured call (one curve per call size), beyond it (the measured grid extended), below
    and past the tokens' points."""
    cm = _profile(tmp_path_factory.mktemp("curves"), experts)
    c = cm.gpu_call_curves()
    got = gpu_call_seconds(c.arrays(), n, per_expert)
    assert got == cm.gpu_experts_seconds(n, per_expert)


def test_the_curves_are_made_once_and_shared_by_a_copy_with_a_policy_time():
    cm = CostModel("h100-mini")
    c = cm.gpu_call_curves()
    assert cm.gpu_call_curves() is c and cm.with_policy_time(5.0).gpu_call_curves() is c
    assert c.by_n.shape == (257, len(c.tokens)) and np.array_equal(
        c.experts, [1, 2, 4, 8, 16, 32, 64, 128, 256]
    )


def _model_split_reference(missed, mtok, nx, resident, capacity, hits, hit_pairs, cm, rows, workers):
    """``clairvoyant_model``'s split written out in numpy and the cost model's own calls (the policy's docstring)."""
    never = nx >= NEVER
    order = np.lexsort((-mtok, nx[missed]))
    ms, mt = missed[order], mtok[order]
    M = len(ms)
    kept_res = int((~never[resident]).sum())
    kept_cum = np.concatenate([[0], np.cumsum(~never[ms])])
    cpu = np.array([cm.cpu_expert_seconds(int(t)) for t in mt], np.float64)
    cpu_rest = np.concatenate([np.cumsum(cpu[::-1])[::-1], [0.0]])
    pairs = np.concatenate([[0], np.cumsum(mt)])
    h2d = cm.expert_h2d_seconds()
    best, best_m = np.inf, M
    for m in range(M + 1):
        n = hits + m
        gpu = (cm.gpu_experts_seconds(n, (hit_pairs + pairs[m]) / n) if n else 0.0) + m * h2d
        cpu_path = cm.cpu_dispatch_seconds(rows) + cpu_rest[m] / workers if m < M else 0.0
        j = max(gpu, cpu_path) - h2d * min(capacity, kept_res + int(kept_cum[m]))
        if j < best - 1e-15:
            best, best_m = j, m
    return set(ms[:best_m].tolist())


@settings(max_examples=80, deadline=None)
@given(
    data=st.data(),
    n_missed=st.integers(1, 30),
    n_resident=st.integers(0, 20),
    capacity=st.integers(1, 40),
    hits=st.integers(0, 20),
    workers=st.integers(1, 4),
)
def test_the_model_split_is_its_reference(data, n_missed, n_resident, capacity, hits, workers):
    """``model_split`` (the kernel ``clairvoyant_model`` decides by, fused or not) copies what the reference copies:
    next uses tied and not, misses with no next use, residents kept or not."""
    cm = CostModel("h100-mini")
    hints = CostHints.from_cost_model(cm, workers)
    E = 64
    ids = data.draw(st.permutations(range(E)))
    missed = np.array(sorted(ids[:n_missed]), np.int64)
    resident = np.array(ids[n_missed : n_missed + n_resident], np.int64)
    mtok = np.array(data.draw(st.lists(st.integers(1, 40), min_size=n_missed, max_size=n_missed)), np.int64)
    nx = np.array(data.draw(st.lists(st.sampled_from([3, 4, 9, NEVER]), min_size=E, max_size=E)), np.int64)
    rows = int(mtok.max()) + data.draw(st.integers(0, 8))
    hit_pairs = hits * data.draw(st.integers(1, 5))
    row = np.zeros(E, np.bool_)
    row[resident] = True
    cpu_s, dispatch_s = hints.cost_arrays(rows)
    c = hints.gpu_curves
    to_gpu = model_split(
        missed, mtok, nx, row, capacity, hits, hit_pairs, cpu_s, dispatch_s[rows], hints.expert_h2d_s, workers,
        c.arrays(),
    )  # fmt: skip
    want = _model_split_reference(missed, mtok, nx, resident, capacity, hits, hit_pairs, cm, rows, workers)
    assert set(missed[to_gpu].tolist()) == want
