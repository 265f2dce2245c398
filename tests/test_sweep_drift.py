"""The CPU path of a sweep's stored repeats over their prediction, in the order they finished."""

import numpy as np
import pandas as pd
import pytest

from dllm_offload_sim.policies.fiddler import FiddlerPolicy
from dllm_offload_sim.policies.naive_lru import NaiveLRUPolicy
from dllm_offload_sim.runtime.cpu_engine import kt_kernel_variant, kt_unsupported
from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.traces.schema import PREFILL
from dllm_offload_sim.validate.run_store import RunStore
from dllm_offload_sim.validate.sweep import SweepRun, SweepSettings, run_sweep
from dllm_offload_sim.validate.sweep_drift import drift_lines, drift_table, plot_drift, repeat_drift
from tests.simkit import flat_cost, random_request, tiny_topology, write_requests


def _run(store, policy, cache, predicted, measured_by_repeat, finished, mem=80.0):
    """A finished run with a predicted CPU path per forward (forward 0 the prefill) and repeats whose measured CPU
    path is ``measured_by_repeat[k]`` per forward; the last forward is a warm-up the replay did not time."""
    n = len(predicted)
    phase = [PREFILL] + [1] * (n - 1)
    key = f"{policy}-{cache}"
    fw = pd.DataFrame({"forward": range(n), "phase": phase, "predicted_cpu_path_s": predicted, "model": "m"})
    store.save(policy, cache, key, [{"metric": "tpot_ms"}], fw)
    for k, (meas, t) in enumerate(zip(measured_by_repeat, finished)):
        m = len(meas)
        f = pd.DataFrame(
            {
                "forward": range(m),
                "phase": [PREFILL] + [1] * (m - 1),
                "measured": [True] * (m - 1) + [False],
                "cpu_path_s": meas,
            }
        )
        store.save_repeat(
            policy,
            cache,
            key,
            k,
            {"forwards": f},
            {
                "summary": {
                    "tpot_ms": 10.0 + k,
                    "host_mem_gbps": mem - k,
                    "cpu_probe_ms": 2.0 * meas[1] / 0.002,
                    "host_steal_frac": 0.01 * (k + 1),
                },
                "finished_unix_s": t,
            },
        )


def test_a_repeat_s_ratio_is_its_timed_decode_cpu_path_over_the_prediction(tmp_path):
    store = RunStore(tmp_path)
    # prefill (9.0) and the untimed last forward (7.0) are left out: decode forwards 1, 2 measure 2x and 1x
    _run(
        store,
        "fiddler",
        20,
        [1.0, 0.002, 0.002, 0.5],
        [[9.0, 0.004, 0.004, 7.0], [9.0, 0.002, 0.002, 7.0]],
        [1000.0, 1120.0],
    )
    _run(
        store,
        "oled",
        60,
        [1.0, 0.001, 0.003, 0.5],
        [[9.0, 0.001, 0.003, 7.0], [9.0, 0.0015, 0.0045, 7.0]],
        [1060.0, 1180.0],
    )
    _run(store, "naive_lru", 20, [0.0, 0.0, 0.0, 0.0], [[0.0] * 4], [1010.0])  # no CPU path: not listed
    d = repeat_drift(tmp_path)
    assert list(zip(d.policy, d.cache, d.repeat)) == [
        ("fiddler", 20, 0),
        ("oled", 60, 0),
        ("fiddler", 20, 1),
        ("oled", 60, 1),
    ]
    np.testing.assert_allclose(d.cpu_path_ratio, [2.0, 1.0, 1.0, 1.5])
    assert list(d.tpot_ms) == [10.0, 10.0, 11.0, 11.0] and list(d.host_mem_gbps) == [80.0, 80.0, 79.0, 79.0]

    lines = drift_lines(d)
    assert lines[0].startswith(
        "CPU path, measured over predicted, per repeat: median 1.25, range 1.00 .. 2.00 "
        "over 4 repeats of 2 runs"
    )
    assert "at most 67% (fiddler, Cache 20: 2.00, 1.00)" in lines[1]
    # the engine probe here follows the first decode forward's CPU path: r over the four repeats
    probe_r = np.corrcoef(d.cpu_probe_ms, d.cpu_path_ratio)[0, 1]
    assert any(
        "CPU engine's probe call probed before each repeat" in x and f"r = {probe_r:+.2f}" in x for x in lines
    )
    assert lines[-1] == "The hypervisor stole 1.50% of the CPU time during the median repeat, at most 2.00%."
    table = drift_table(d)
    assert "| 3.0 | oled | 60 | 1 | 1.50 | 11.00 | 79.0 | 1.500 | 2.00 |" in table
    paths = plot_drift(d, tmp_path / "fig" / "drift")
    assert all(p.stat().st_size > 0 for p in paths)


def test_a_repeat_whose_forwards_do_not_match_its_run_is_an_error(tmp_path):
    store = RunStore(tmp_path)
    _run(store, "fiddler", 20, [1.0, 0.002, 0.5], [[9.0, 0.004, 0.004, 7.0]], [1.0])
    with pytest.raises(ValueError, match=r"fiddler_c20: repeat 0 has 4 forwards, the run 3"):
        repeat_drift(tmp_path)


def test_repeats_stored_before_their_finishing_time_was_kept_come_last_and_are_not_plotted(tmp_path):
    store = RunStore(tmp_path)
    _run(store, "fiddler", 20, [1.0, 0.002, 0.002, 0.5], [[9.0, 0.004, 0.004, 7.0]], [float("nan")])
    d = repeat_drift(tmp_path)
    assert len(d) == 1 and np.isnan(d.finished_unix_s[0])
    assert "| " + " | fiddler | 20 | 0 | 2.00 |" in drift_table(d)
    with pytest.raises(ValueError, match="finished_unix_s"):
        plot_drift(d, tmp_path / "drift")
    assert repeat_drift(tmp_path / "nothing").empty


@pytest.mark.parametrize(
    "engine",
    [
        "torch",
        pytest.param(
            "kt",
            marks=pytest.mark.skipif(
                kt_kernel_variant() is None, reason="kt-kernel (with a BF16 MoE) is not installed"
            ),
        ),
    ],
)
def test_a_cpu_sweep_stores_when_each_repeat_finished(tmp_path, engine):
    """Each repeat keeps the time it finished and the CPU engine's probe call before it (8 rows a forward: the kt
    engine, sized for the largest forward, takes the probe's call over all 8 experts)."""
    topo = tiny_topology(n_moe=3, n_experts=8).with_widths(n_group=2, topk_group=1)
    assert kt_unsupported(topo) is None
    path = write_requests(tmp_path / "t", topo, [random_request(np.random.default_rng(0), 0, topo, 6, 8)])
    runs = [SweepRun("naive_lru", NaiveLRUPolicy, 3, "key-a"), SweepRun("fiddler", FiddlerPolicy, 3, "key-b")]
    run_sweep(
        runs,
        RunStore(tmp_path / "out"),
        Trace.open(path),
        flat_cost(topo),
        [0],
        SweepSettings(repeats=2, interleave=True, device="cpu", cpu_engine=engine),
    )
    d = repeat_drift(tmp_path / "out")
    assert list(zip(d.policy, d.repeat)) == [
        ("fiddler", 0),
        ("fiddler", 1),
    ]  # naive_lru runs nothing on the CPU
    assert d.finished_unix_s.is_monotonic_increasing and np.isfinite(d.finished_unix_s).all()
    if engine == "torch":  # the native engine times its CPU path on a GPU's clock: none on a CPU device
        assert (d.cpu_path_ratio > 0).all() and np.isfinite(d.cpu_path_ratio).all()
    else:
        assert d.cpu_path_ratio.isna().all() and drift_lines(d) == []
    assert (d.cpu_probe_ms > 0).all()  # the engine's probe call before each replay


def test_a_sweep_of_a_few_minutes_is_split_in_tenths_of_a_minute(tmp_path):
    """The ratio by time takes the sweep's four quarters; under 5 minutes each they are labelled in tenths."""
    store = RunStore(tmp_path)
    t0 = 1000.0
    for i, p in enumerate(("fiddler", "tide", "oled")):
        _run(
            store,
            p,
            40,
            [1.0, 0.002, 0.002, 0.5],
            [[9.0, 0.002, 0.002, 7.0], [9.0, 0.003, 0.003, 7.0]],
            [t0 + 10 * i, t0 + 60 + 12 * i],
        )
    line = next(x for x in drift_lines(repeat_drift(tmp_path)) if x.startswith("Median ratio by the time"))
    assert "0.0-0.4 min: 1.00" in line and "1.1-1.4 min: 1.50" in line, line
