"""The analytics command runs on the shipped trace and writes its tables and plots."""

import json

from traces.reader import Trace
from traces.shipped import default_trace_path
from traces.stats import main


def test_shipped_trace_is_valid_and_small():
    p = default_trace_path()
    size = sum(f.stat().st_size for f in p.iterdir())
    assert size < 5 * 1024 * 1024
    Trace.open(p).validate()


def test_stats_cli_on_shipped_trace(tmp_path, capsys):
    assert main(["--out", str(tmp_path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "adjacent_overlap" in out and "boundary_overlap" in out and "distinct_experts_per_layer" in out
    for f in ("summary.json", "overlap.csv", "layers.csv", "confidence.csv", "fig7_overlap_vs_gap.png",
              "fig4_footprint_flops.png", "fig10_confidence_layers.png"):
        assert (tmp_path / f).stat().st_size > 0, f
    s = json.loads((tmp_path / "summary.json").read_text())
    assert 0.85 <= s["adjacent_overlap"] <= 0.90


def test_stats_cli_bad_trace(tmp_path, capsys):
    assert main([str(tmp_path / "missing"), "--quiet", "--no-plots"]) == 2
    assert "no such trace directory" in capsys.readouterr().err
