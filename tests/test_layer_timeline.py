"""The per-layer timeline: when each MoE layer's parts happen, simulated (``sim.engine.LayerTimes``) and replayed
(``runtime.replay.LayerStamps``), side by side per (forward, layer) (``validate.fidelity.layer_timeline``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dllm_offload_sim.policies.ktransformers import KTransformersPolicy
from dllm_offload_sim.policies.oled import OLEDPolicy
from dllm_offload_sim.sim.run import simulate
from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.validate.fidelity import fidelity_rows
from dllm_offload_sim.validate.run_store import RunStore
from tests.simkit import flat_cost, random_request, tiny_topology, write_requests


def _trace(tmp_path, n_moe=4):
    topo = tiny_topology(n_moe=n_moe, n_experts=8).with_widths(n_group=2, topk_group=1)
    rng = np.random.default_rng(3)
    return topo, Trace.open(write_requests(tmp_path / "t", topo, [random_request(rng, r, topo, 9, 3) for r in (0, 1)]))


def test_the_simulator_records_each_moe_layers_parts_alike_in_closed_form_and_as_events(tmp_path):
    topo, tr = _trace(tmp_path)
    runs = [simulate(tr, OLEDPolicy(), 3, flat_cost(topo), record_layers=True, closed_form=cf) for cf in (True, False)]
    a, b = (r.layers for r in runs)
    pd.testing.assert_frame_equal(a, b)
    pf = runs[0].per_forward
    assert len(a) == len(pf) * topo.n_moe_layers  # one row per MoE layer executed
    assert (a.gate_s <= a.gpu_end_s).all() and (a.gpu_end_s <= a.end_s).all()
    has_cpu = a.to_cpu > 0
    assert has_cpu.any() and (a.cpu_end_s[has_cpu] <= a.end_s[has_cpu]).all()
    assert a.cpu_end_s[~has_cpu].isna().all()  # no CPU path, no CPU end
    # the layers' ends lie inside their forward, in layer order
    dur = dict(zip(pf.forward, pf.duration_s))
    assert all(e <= dur[f] + 1e-12 for f, e in zip(a.forward, a.end_s))
    assert all((g.end_s.diff().dropna() > 0).all() for _, g in a.groupby("forward"))
    assert simulate(tr, OLEDPolicy(), 3, flat_cost(topo)).layers is None  # off by default


@pytest.mark.parametrize("make", [OLEDPolicy, KTransformersPolicy])
def test_a_replay_records_each_layers_host_stamps_beside_the_prediction(tmp_path, make):
    topo, tr = _trace(tmp_path)
    rows, fwd, lay = fidelity_rows(tr, make, make.name, 3, flat_cost(topo), [0, 1], device="cpu", record_layers=True)
    assert len(lay) == len(fwd) * topo.n_moe_layers
    assert not lay.duplicated(["forward", "layer"]).any()
    host = lay[["measured_host_ready_s", "measured_host_decided_s", "measured_host_submitted_s",
                "measured_host_issued_s", "measured_host_end_s"]].to_numpy()
    assert (host >= 0).all() and (np.diff(host, axis=1) >= 0).all()  # in the order the runtime's thread works
    assert lay.measured_gpu_gate_s.isna().all()  # no GPU clock on a CPU device
    assert (lay.predicted_to_cpu > 0).any() and set(lay.policy) == {make.name} and set(lay.cache) == {3}
    # the same layers, in the same order, on both sides: the per-forward counters of either agree
    per_fwd = lay.groupby("forward").predicted_to_cpu.sum()
    assert (per_fwd.to_numpy() == fwd.set_index("forward").loc[per_fwd.index, "to_cpu"].to_numpy()).all()
    assert fidelity_rows(tr, make, make.name, 3, flat_cost(topo), [0], device="cpu").layers is None


def test_a_finished_runs_timeline_is_kept_and_read_back(tmp_path):
    store = RunStore(tmp_path)
    lay = pd.DataFrame({"forward": [0, 0], "layer": [0, 1], "predicted_end_s": [1e-3, 2e-3]})
    store.save("oled", 40, "k", [{"metric": "tpot_ms"}], pd.DataFrame({"forward": [0]}), lay)
    pd.testing.assert_frame_equal(store.load_layers("oled", 40), lay)
    store.save("lru", 40, "k", [{"metric": "tpot_ms"}], pd.DataFrame({"forward": [0]}))
    assert store.load_layers("lru", 40) is None  # recorded none


def test_the_report_places_each_runs_layers_in_one_row(tmp_path, capsys):
    """``dllm-report`` on a run directory whose runs recorded their timeline: one row per run, the spans from the
    host's stamps where the device had no GPU clock."""
    from dllm_offload_sim.validate.report import main as report

    topo, tr = _trace(tmp_path)
    store = RunStore(tmp_path / "sweep")
    for make in (OLEDPolicy, KTransformersPolicy):
        rows, fwd, lay = fidelity_rows(tr, make, make.name, 3, flat_cost(topo), [0, 1], device="cpu",
                                       record_layers=True)
        store.save(make.name, 3, "k", rows, fwd, lay)
        (tmp_path / "sweep" / "runs" / f"{make.name}_c3" / "done.json").write_text('{"key": "k"}')
    assert report([str(tmp_path / "sweep")]) == 0
    out = capsys.readouterr().out
    part = out.split("### Per MoE layer")[1]
    lines = [ln for ln in part.splitlines() if ln.startswith("| oled") or ln.startswith("| ktransformers")]
    assert len(lines) == 2
    cells = lines[0].split("|")[1:-1]
    pred, meas = (float(v) for v in cells[3].split("/"))  # span predicted / measured (host clock on a CPU device)
    assert pred > 0 and meas > 0
