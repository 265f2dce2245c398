"""Profile reproducibility check: per-curve differences, and the monotone envelope that removes spikes."""

import json

import numpy as np

from hwprofile.compare import curve_differences, main, monotone_envelope
from hwprofile.profile import PROFILE_DIR, load_profile

# a fixed measured profile (not the moving default) whose grouped-call curve has a flat host floor at its
# smallest points, so that the envelope of a spike there lands within 5% of the original
FIXTURE = PROFILE_DIR / "repro" / "h200-mini.2026-12-03-eager.json"


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
    from hwprofile.compare import curve_report

    r = curve_report(load_profile(FIXTURE), load_profile(_with_spike(tmp_path, 3.0)))["gpu_experts"]
    grid = load_profile(FIXTURE).curves["gpu_experts"]
    assert r["at"] == {"experts": grid["experts"][0], "tokens_per_expert": grid["tokens_per_expert"][0]}
    assert abs(r["b_s"] - 3 * r["a_s"]) < 1e-12 and r["median"] == 0.0  # one spiky point, the level unmoved
    main([str(FIXTURE), str(_with_spike(tmp_path, 3.0))])
    assert "median  0.00%; max at experts" in capsys.readouterr().out
