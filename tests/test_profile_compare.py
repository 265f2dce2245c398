"""Profile reproducibility check: per-curve differences, and the monotone envelope that removes spikes."""

import json
from pathlib import Path

import numpy as np

from dllm_offload_sim.costmodel.compare import curve_differences, main, monotone_envelope
from dllm_offload_sim.costmodel.profile import load_profile

# a fixed measured profile (not the moving default) whose grouped-call curve has a flat host floor at its
# smallest points, so that the envelope of a spike there lands within 5% of the original
FIXTURE = Path(__file__).parent / "fixtures" / "h200-mini.eager.json"


def test_monotone_envelope_removes_an_isolated_spike_and_keeps_monotone_curves():
    assert monotone_envelope([1.0, 5.0, 2.0, 3.0]).tolist() == [1.0, 2.0, 2.0, 3.0]
    grid = np.array([[1.0, 2.0], [2.0, 3.0]])
    np.testing.assert_array_equal(monotone_envelope(grid), grid)  # already monotone: unchanged
    grid[0, 0] = 9.0  # a spike at the smallest point
    assert monotone_envelope(grid)[0, 0] == 2.0


def _with_spike(tmp_path, factor):
    d = json.loads(open(FIXTURE).read())
    s = np.asarray(d["gpu_experts"]["seconds"])
    s[0, 0] *= factor
    d["gpu_experts"]["seconds"] = s.tolist()
    p = tmp_path / "spiky.json"
    p.write_text(json.dumps(d))
    return p


def test_a_spike_counts_raw_but_not_under_the_envelope(tmp_path):
    a, b = load_profile(FIXTURE), load_profile(_with_spike(tmp_path, 3.0))
    assert max(curve_differences(a, a).values()) == 0.0
    raw, env = curve_differences(a, b), curve_differences(a, b, envelope=True)
    assert abs(raw["gpu_experts"] - 2.0) < 1e-9  # 3x at one point: +200%
    assert env["gpu_experts"] <= curve_differences(a, a, envelope=True)["gpu_experts"] + 0.05
    assert raw["h2d"] == env["h2d"] == 0.0


def test_cli_exit_status_says_whether_every_curve_is_within_tolerance(tmp_path, capsys):
    spiky = str(_with_spike(tmp_path, 3.0))
    assert main([str(FIXTURE), str(FIXTURE)]) == 0
    assert main([str(FIXTURE), spiky]) == 1
    assert "gpu_experts" in capsys.readouterr().out
    assert main([str(FIXTURE), spiky, "--envelope"]) == 0


def test_report_says_where_the_largest_difference_is_and_the_median(tmp_path, capsys):
    from dllm_offload_sim.costmodel.compare import curve_report

    r = curve_report(load_profile(FIXTURE), load_profile(_with_spike(tmp_path, 3.0)))["gpu_experts"]
    grid = load_profile(FIXTURE).curves["gpu_experts"]
    assert r["at"] == {"experts": grid["experts"][0], "tokens_per_expert": grid["tokens_per_expert"][0]}
    assert abs(r["b_s"] - 3 * r["a_s"]) < 1e-12 and r["median"] == 0.0  # one spiky point, the level unmoved
    main([str(FIXTURE), str(_with_spike(tmp_path, 3.0))])
    assert "median  0.00%; max at experts" in capsys.readouterr().out


def test_fitted_h2d_line_is_compared_and_ignores_what_the_fit_smooths(tmp_path):
    d = json.loads(open(FIXTURE).read())
    s = np.asarray(d["h2d"]["seconds"])
    s[0] *= 1.10  # the smallest copy 10% slower: the raw point moves 10%, the fitted line (all sizes) ~2%
    d["h2d"]["seconds"] = s.tolist()
    p = tmp_path / "slow_copy.json"
    p.write_text(json.dumps(d))
    r = curve_differences(load_profile(FIXTURE), load_profile(p))
    assert abs(r["h2d"] - 0.10) < 1e-9 and 0 < r["h2d_fit"] < 0.05


def test_host_probes_are_printed_side_by_side(tmp_path, capsys):
    d = json.loads(open(FIXTURE).read())
    probe = {"ref_expert_1tok_us": 200.0, "ref_expert_8tok_us": 250.0, "mem_gbps": 80.0, "loadavg_1m": 1.0}
    d["stamp"]["host_probe"] = {
        "before": probe,
        "after": probe,
        "steal_frac": 0.01,
        "cpu_expert_steal_frac": 0.02,
    }
    a = tmp_path / "a.json"
    a.write_text(json.dumps(d))
    d["stamp"]["host_probe"]["before"] = {**probe, "ref_expert_1tok_us": 300.0}
    b = tmp_path / "b.json"
    b.write_text(json.dumps(d))
    main([str(a), str(b)])
    out = capsys.readouterr().out
    assert "ref_expert_1tok_us    200.00 vs    300.00   50.00%" in out and "steal_frac" in out
    main([str(FIXTURE), str(b)])  # only one has probes: no probe lines
    assert "ref_expert" not in capsys.readouterr().out


def test_missing_profile_is_a_clear_error_not_a_traceback(tmp_path, capsys):
    assert main([str(tmp_path / "nope.json"), str(FIXTURE)]) == 2
    assert "nope.json" in capsys.readouterr().err


def test_steal_meter_reads_a_fraction_or_nothing():
    from dllm_offload_sim.profiler.host_probe import StealMeter, cpu_times

    f = StealMeter().fraction()
    assert f is None or 0.0 <= f <= 1.0
    t = cpu_times()
    assert t is None or (t[0] >= t[1] >= 0)


def test_the_engine_settles_once_two_probe_rounds_agree(monkeypatch):
    """``settle_engine``: probe rounds until two in a row agree within 3% (a fresh engine's first calls run slower),
    at most ``rounds``; nothing where the engine cannot take the probe's call."""
    from dllm_offload_sim.profiler import host_probe

    def rounds(*values):
        it = iter(values)
        monkeypatch.setattr(host_probe, "cpu_engine_probe_seconds", lambda *a, **k: next(it))

    rounds(3.0e-3, 2.5e-3, 2.4e-3, 2.39e-3, 1.0)
    assert host_probe.settle_engine(None, 8, 16) == [3.0e-3, 2.5e-3, 2.4e-3, 2.39e-3]
    rounds(*([3e-3, 2e-3] * 10))
    assert len(host_probe.settle_engine(None, 8, 16, rounds=5)) == 5  # never agreed: stops at the cap
    rounds(float("nan"))
    assert host_probe.settle_engine(None, 8, 16) == []
