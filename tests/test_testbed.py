"""The paper's testbeds as profiles (costmodel/testbed.py): sourced assumptions, the carried-over curves, the shipped
files regenerated from them."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from dllm_offload_sim.costmodel.cost_model import CostModel, fit_h2d
from dllm_offload_sim.costmodel.profile import PROFILE_DIR, load_profile
from dllm_offload_sim.costmodel.testbed import StreamedBytes, paper_testbed, paper_testbeds, estimate_testbed
from dllm_offload_sim.traces.topology import topology_preset


def test_every_assumption_has_a_source_and_sits_in_its_range():
    for tb in paper_testbeds():
        for name, a in tb.assumptions().items():
            assert a.low <= a.value <= a.high, name
            assert len(a.source) > 20 and a.unit, name


def test_a_testbed_equal_to_the_measured_host_gives_back_its_curves():
    tb = paper_testbed("mini")
    base = load_profile("h100-mini")
    _, bw = fit_h2d(base.h2d["bytes"], base.h2d["seconds"])
    same = replace(tb, gpu_peak_gbps=tb.measured_gpu_peak_gbps)
    p = estimate_testbed(same, pcie_gbps=bw / 1e9, cpu_mem_gbps=base.cpu_curve_gbps())
    for name in ("gpu_experts", "non_expert", "dense_layer", "per_forward", "cpu_expert"):
        assert np.allclose(p.curves[name]["seconds"], base.curves[name]["seconds"], rtol=1e-12), name
    assert np.allclose(p.h2d["seconds"], base.h2d["seconds"], rtol=0.05)  # the fit's residual only


@pytest.mark.parametrize("model", ["mini", "flash"])
def test_gpu_curves_gain_the_streaming_time_of_their_bytes(model):
    tb = paper_testbed(model)
    base, p = load_profile(f"h100-{model}"), estimate_testbed(tb)
    eff = tb.gpu_efficiency.value
    per_byte = 1 / (eff * 1792e9) - 1 / (eff * 3350e9)
    b = StreamedBytes.of(topology_preset(model))
    got = np.asarray(p.curves["gpu_experts"]["seconds"]) - np.asarray(base.curves["gpu_experts"]["seconds"])
    want = np.asarray(base.curves["gpu_experts"]["experts"])[:, None] * b.expert * per_byte
    assert np.allclose(got, np.broadcast_to(want, got.shape))
    assert np.allclose(
        np.asarray(p.curves["per_forward"]["seconds"]) - base.curves["per_forward"]["seconds"],
        b.lm_head * per_byte,
    )
    # the CPU engine streams at the testbed's bandwidth: faster than the 14-thread measured host
    assert p.curves["cpu_expert"]["seconds"][0] < base.curves["cpu_expert"]["seconds"][0]
    assert CostModel(p).pcie_gbps == pytest.approx(tb.pcie_gbps.value, rel=1e-3)


@pytest.mark.parametrize("model", ["mini", "flash"])
def test_the_shipped_testbed_profiles_are_the_derivation_at_its_central_values(model):
    tb = paper_testbed(model)
    shipped = json.loads((PROFILE_DIR / f"{tb.profile_name}.estimated.json").read_text())
    made = estimate_testbed(tb).to_dict()
    shipped.pop("stamp", None), made.pop("stamp", None)
    assert json.dumps(shipped, sort_keys=True) == json.dumps(json.loads(json.dumps(made)), sort_keys=True)
