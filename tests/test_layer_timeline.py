"""The per-layer timeline: when each MoE layer's parts happen, simulated (``sim.engine.LayerTimes``) and replayed
(``runtime.layer_stamps.LayerStamps``), side by side per (forward, layer) (``validate.fidelity.layer_timeline``)."""

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
    return topo, Trace.open(
        write_requests(tmp_path / "t", topo, [random_request(rng, r, topo, 9, 3) for r in (0, 1)])
    )


def test_the_simulator_records_each_moe_layers_parts_alike_in_closed_form_and_as_events(tmp_path):
    topo, tr = _trace(tmp_path)
    runs = [
        simulate(tr, OLEDPolicy(), 3, flat_cost(topo), record_layers=True, closed_form=cf)
        for cf in (True, False)
    ]
    a, b = (r.layers for r in runs)
    pd.testing.assert_frame_equal(a, b)
    pf = runs[0].per_forward
    assert len(a) == len(pf) * topo.n_moe_layers  # one row per MoE layer executed
    assert (a.gate_s <= a.gpu_end_s).all() and (a.gpu_end_s <= a.end_s).all()
    has_cpu = a.to_cpu > 0
    assert has_cpu.any() and (a.cpu_end_s[has_cpu] <= a.end_s[has_cpu]).all()
    assert a.cpu_end_s[~has_cpu].isna().all()  # no CPU path, no CPU end
    # the CPU experts are computed by the CPU path's end, the copies land by the GPU path's end; NaN where none ran
    assert (a.gate_s[has_cpu] < a.cpu_computed_s[has_cpu]).all()
    assert (a.cpu_computed_s[has_cpu] <= a.cpu_end_s[has_cpu]).all() and a.cpu_computed_s[
        ~has_cpu
    ].isna().all()
    copied = a.to_gpu > 0
    assert copied.any() and (a.copies_end_s[copied] <= a.gpu_end_s[copied]).all()
    assert a.copies_end_s[~copied].isna().all()
    # the layers' ends lie inside their forward, in layer order
    dur = dict(zip(pf.forward, pf.duration_s))
    assert all(e <= dur[f] + 1e-12 for f, e in zip(a.forward, a.end_s))
    assert all((g.end_s.diff().dropna() > 0).all() for _, g in a.groupby("forward"))
    assert simulate(tr, OLEDPolicy(), 3, flat_cost(topo)).layers is None  # off by default


@pytest.mark.parametrize("make", [OLEDPolicy, KTransformersPolicy])
def test_a_replay_records_each_layers_host_stamps_beside_the_prediction(tmp_path, make):
    topo, tr = _trace(tmp_path)
    rows, fwd, lay = fidelity_rows(
        tr, make, make.name, 3, flat_cost(topo), [0, 1], device="cpu", record_layers=True
    )
    assert len(lay) == len(fwd) * topo.n_moe_layers
    assert not lay.duplicated(["forward", "layer"]).any()
    host = lay[
        [
            "measured_host_ready_s",
            "measured_host_decided_s",
            "measured_host_submitted_s",
            "measured_host_issued_s",
            "measured_host_end_s",
        ]
    ].to_numpy()
    assert (host >= 0).all() and (np.diff(host, axis=1) >= 0).all()  # in the order the runtime's thread works
    assert lay.measured_gpu_gate_s.isna().all()  # no GPU clock on a CPU device
    assert lay.measured_copies_end_s.isna().all() and lay.measured_cpu_computed_s.isna().all()
    # the replay counts its grouped calls and their host time (profiler's grouped_issue_seconds reads them)
    assert (fwd.measured_grouped_calls > 0).all() and (fwd.measured_grouped_issue_s > 0).all()
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
        rows, fwd, lay = fidelity_rows(
            tr, make, make.name, 3, flat_cost(topo), [0, 1], device="cpu", record_layers=True
        )
        store.save(make.name, 3, "k", rows, fwd, lay)
        (tmp_path / "sweep" / "runs" / f"{make.name}_c3" / "done.json").write_text('{"key": "k"}')
    assert report([str(tmp_path / "sweep")]) == 0
    out = capsys.readouterr().out
    part = out.split("### Per MoE layer")[1]
    lines = [ln for ln in part.splitlines() if ln.startswith("| oled") or ln.startswith("| ktransformers")]
    assert len(lines) == 2
    cells = lines[0].split("|")[1:-1]
    # span predicted / measured (host clock on a CPU device)
    pred, meas = (float(v) for v in cells[3].split("/"))
    assert pred > 0 and meas > 0


def test_the_per_layer_table_reads_each_part_from_the_gpu_clock_where_there_is_one():
    """Two decode layers of one forward with GPU-clock stamps: the table's span, lead, CPU path and tail are the
    differences of those stamps (us), the CPU columns over the layers with a CPU call only."""
    from dllm_offload_sim.validate.layer_timeline import timeline_table

    row = dict(
        model="m",
        policy="oled",
        cache=40,
        forward=1,
        predicted_gate_s=0.0,
        predicted_gpu_end_s=0.0,
        predicted_to_gpu=1,
        measured_host_ready_s=0.0,
        measured_host_decided_s=0.0,
        measured_host_submitted_s=0.0,
        measured_host_issued_s=0.0,
        measured_host_end_s=0.0,
    )
    lay = pd.DataFrame(
        [
            {
                **row,
                "layer": 0,
                "predicted_cpu_end_s": float("nan"),
                "predicted_end_s": 1e-3,
                "predicted_to_cpu": 0,
                "measured_gpu_gate_s": 0.5e-3,
                "measured_cpu_start_s": float("nan"),
                "measured_cpu_end_s": float("nan"),
                "measured_gpu_end_s": 1.1e-3,
            },
            {
                **row,
                "layer": 1,
                "predicted_gate_s": 1.2e-3,
                "predicted_cpu_end_s": 2.2e-3,
                "predicted_gpu_end_s": 2.0e-3,
                "predicted_end_s": 2.2e-3,
                "predicted_to_cpu": 3,
                "measured_host_ready_s": 1.2e-3,
                "measured_host_submitted_s": 1.5e-3,
                "measured_gpu_gate_s": 1.3e-3,
                "measured_cpu_start_s": 1.6e-3,
                "measured_cpu_end_s": 2.6e-3,
                "measured_gpu_end_s": 2.7e-3,
            },
        ]
    )
    fwd = pd.DataFrame({"model": ["m"], "policy": ["oled"], "cache": [40], "forward": [1], "phase": [1]})
    line = next(ln for ln in timeline_table(lay, fwd).splitlines() if ln.startswith("| oled"))
    cells = [c.strip() for c in line.split("|")[1:-1]]
    assert cells[2] == "2 (1)"
    assert cells[3] == "1200 / 1600"  # span of layer 1 (the only one with a layer before it)
    assert cells[4] == "1200 / 1600"
    assert cells[5] == "300"  # routing computed (1.3 ms) to CPU path start (1.6 ms)
    assert cells[6] == "1000 / 1000"  # CPU path predicted from the gate, measured start to end
    assert cells[7] == "100"  # CPU path end to the layer's end
    assert cells[9].startswith("300 /")  # host: routing to CPU call submitted
    prefill = fwd.assign(phase=0)
    assert "| oled" not in timeline_table(lay, prefill)  # prefill forwards left out


def test_the_cpu_excess_table_bins_each_cpu_call_by_the_gpu_work_beside_it():
    """Each decode layer with a timed CPU call after a layer of its forward: (previous layer's end to CPU path end,
    measured) minus (predicted), median per bin of the predicted GPU path beside it (us); the forward's first layer,
    layers without a CPU call and layers without the GPU's clock are left out, and a table with none is ''."""
    from dllm_offload_sim.validate.layer_timeline import cpu_excess_table

    def layer(i, gpu_us, excess_us, to_cpu=3, clock=True):
        base = i * 0.01  # each layer 10 ms after the one before; it ends 2 ms after its gate on both sides
        nan = float("nan")
        return dict(
            model="m",
            policy="oled",
            cache=40,
            forward=1,
            layer=i,
            predicted_gate_s=base,
            predicted_cpu_end_s=base + 1e-3,
            predicted_gpu_end_s=base + gpu_us * 1e-6,
            predicted_end_s=base + 2e-3,
            predicted_to_cpu=to_cpu,
            measured_gpu_gate_s=base + 0.1e-3 if clock else nan,
            measured_cpu_end_s=(base + 1e-3 + excess_us * 1e-6) if clock else nan,
            measured_gpu_end_s=base + 2e-3 if clock else nan,
        )

    lay = pd.DataFrame(
        [
            layer(0, 100, 700),
            layer(1, 100, 50),
            layer(2, 300, 250),
            layer(3, 350, 260),
            layer(4, 300, 900, to_cpu=0),
            layer(5, 300, 900, clock=False),
        ]
    )
    fwd = pd.DataFrame({"model": ["m"], "policy": ["oled"], "cache": [40], "forward": [1], "phase": [1]})
    line = next(ln for ln in cpu_excess_table(lay, fwd).splitlines() if ln.startswith("| oled"))
    cells = [c.strip() for c in line.split("|")[1:-1]]
    assert cells[:4] == ["oled", "40", "50 (1)", "255 (2)"] and set(cells[4:]) == {""}
    assert cpu_excess_table(lay, fwd.assign(phase=0)) == ""  # prefill forwards left out: no call to show


def test_the_parts_table_places_copies_cpu_compute_and_result_of_each_cooperative_layer():
    """Decode layers with both a CPU call and copies, after a layer of the same forward: each part's median from the
    previous layer's end, predicted / measured, and the median per-layer excess (us); layers with one path only are
    left out; tables without the parts give ''."""
    from dllm_offload_sim.validate.layer_timeline import cooperative_parts_table

    def layer(i, to_gpu=2, late_copies_us=0.0, start=0.0):
        s = start * 1e-3
        return dict(
            model="m",
            policy="oled",
            cache=40,
            forward=1,
            layer=i,
            predicted_to_cpu=3,
            predicted_to_gpu=to_gpu,
            predicted_gate_s=s + 0.3e-3,
            predicted_copies_end_s=s + 1.0e-3,
            predicted_cpu_computed_s=s + 0.9e-3,
            predicted_cpu_end_s=s + 1.01e-3,
            predicted_gpu_end_s=s + 1.1e-3,
            predicted_end_s=s + 1.1e-3,
            measured_gpu_gate_s=s + 0.2e-3,
            measured_copies_end_s=s + (1.2 + late_copies_us * 1e-3) * 1e-3,
            measured_cpu_computed_s=s + 0.9e-3,
            measured_cpu_end_s=s + (1.21 + late_copies_us * 1e-3) * 1e-3,
            measured_gpu_end_s=s + (1.3 + late_copies_us * 1e-3) * 1e-3,
        )

    # layer 0 has no layer before it; layers 1 and 2 start where the one before ended (1.1 ms predicted, 1.3 measured
    # after each start)
    lay = pd.DataFrame(
        [
            layer(0),
            layer(1, start=0.0),
            layer(2, late_copies_us=200, start=0.0),
            layer(3, to_gpu=0, late_copies_us=900),
        ]
    )
    lay.loc[
        1,
        [
            "predicted_gate_s",
            "predicted_copies_end_s",
            "predicted_cpu_computed_s",
            "predicted_cpu_end_s",
            "predicted_gpu_end_s",
            "predicted_end_s",
        ],
    ] += 1.1e-3
    lay.loc[
        1,
        [
            "measured_gpu_gate_s",
            "measured_copies_end_s",
            "measured_cpu_computed_s",
            "measured_cpu_end_s",
            "measured_gpu_end_s",
        ],
    ] += 1.3e-3
    lay.loc[
        2,
        [
            "predicted_gate_s",
            "predicted_copies_end_s",
            "predicted_cpu_computed_s",
            "predicted_cpu_end_s",
            "predicted_gpu_end_s",
            "predicted_end_s",
        ],
    ] += 2.2e-3
    lay.loc[
        2,
        [
            "measured_gpu_gate_s",
            "measured_copies_end_s",
            "measured_cpu_computed_s",
            "measured_cpu_end_s",
            "measured_gpu_end_s",
        ],
    ] += 2.6e-3
    lay.loc[3, "measured_copies_end_s"] = float("nan")
    fwd = pd.DataFrame({"model": ["m"], "policy": ["oled"], "cache": [40], "forward": [1], "phase": [1]})
    line = next(ln for ln in cooperative_parts_table(lay, fwd).splitlines() if ln.startswith("| oled"))
    cells = [c.strip() for c in line.split("|")[1:-1]]
    assert cells[2] == "2"  # layer 0 (nothing before it) and layer 3 (no copies) are left out
    assert (
        cells[3] == "300 / 200 (-100)"
    )  # the simulated gate comes after the decision, the measured one before
    assert (
        cells[4] == "1000 / 1300 (300)"
    )  # copies landed 1.2 and 1.4 ms after the previous end: 0.2, 0.4 late
    assert cells[5] == "900 / 900 (0)"  # CPU experts computed on time
    assert cells[6] == "1010 / 1310 (300)"  # the result waits behind the copies
    assert cells[7] == "1100 / 1400 (300)"
    assert cooperative_parts_table(lay.drop(columns=["measured_copies_end_s"]), fwd) == ""


def test_the_copies_fit_tells_copies_that_start_late_from_a_slow_copy_engine():
    """Layers with n copies each starting where the one before ended: predicted to land 500 us + 120 us a copy after
    it; measured, the host's routing 100 us after it, its last launch 400 us + 10 us a copy after that, and the copies
    200 us + 120 us a copy after the launch (700 us + 130 us a copy in all): the table gives each line back; layers
    without copies or without a layer before them are left out, and a table without the stamps gives ''."""
    from dllm_offload_sim.validate.layer_timeline import copies_fit_table

    rows, p_end, m_end = [], 0.0, 0.0
    for i, n in enumerate([0, 4, 8, 12, 16, 0]):
        ready = m_end + 100e-6
        issued = ready + 400e-6 + 10e-6 * n
        p_copies, m_copies = p_end + 500e-6 + 120e-6 * n, issued + 200e-6 + 120e-6 * n
        rows.append(
            dict(
                model="m",
                policy="oled",
                cache=40,
                forward=1,
                layer=i,
                predicted_to_gpu=n,
                predicted_to_cpu=2,
                predicted_copies_end_s=p_copies if n else float("nan"),
                measured_copies_end_s=m_copies if n else float("nan"),
                measured_host_ready_s=ready,
                measured_host_issued_s=issued,
                predicted_end_s=p_end + 3e-3,
                measured_gpu_end_s=m_end + 3.5e-3,
            )
        )
        p_end, m_end = p_end + 3e-3, m_end + 3.5e-3
    lay = pd.DataFrame(rows)
    fwd = pd.DataFrame({"model": ["m"], "policy": ["oled"], "cache": [40], "forward": [1], "phase": [1]})
    line = next(ln for ln in copies_fit_table(lay, fwd).splitlines() if ln.startswith("| oled"))
    cells = [c.strip() for c in line.split("|")[1:-1]]
    # measured from the previous end: 100 (ready) + 400 + 10 n + 200 + 120 n = 700 + 130 n
    assert cells[2:] == ["4", "10.0", "500 + 120.0", "700 + 130.0", "120.0", "400 + 10.0"]
    assert copies_fit_table(lay.drop(columns=["measured_host_issued_s"]), fwd) == ""
    assert copies_fit_table(lay, fwd.assign(phase=0)) == ""


def test_a_layers_gpu_events_fill_its_stamps_in_seconds_from_the_forwards_start():
    """``LayerEvents.stamp``: each event's milliseconds after the forward's start event become the stamps' seconds;
    the parts a layer did not have stay NaN."""
    from dllm_offload_sim.runtime.layer_stamps import LayerEvents, LayerStamps

    class Begin:  # an event's elapsed_time to another, in ms: here the other "event" is its ms value
        def elapsed_time(self, ms):
            return ms

    both = LayerStamps(0, 1, 0.0, 0.0, 0.0, 0.0, 0.0)
    LayerEvents(both, 1.0, 4.0, (1.5, 3.5), 3.0, 3.2).stamp(Begin())
    assert (both.gpu_gate_s, both.gpu_end_s, both.cpu_start_s, both.cpu_end_s) == (1e-3, 4e-3, 1.5e-3, 3.5e-3)
    assert (both.cpu_computed_s, both.copies_end_s) == (3e-3, 3.2e-3)
    hits = LayerStamps(0, 2, 0.0, 0.0, 0.0, 0.0, 0.0)
    LayerEvents(hits, 5.0, 6.0).stamp(Begin())
    assert (hits.gpu_gate_s, hits.gpu_end_s) == (5e-3, 6e-3)
    assert all(v != v for v in (hits.cpu_start_s, hits.cpu_end_s, hits.cpu_computed_s, hits.copies_end_s))
