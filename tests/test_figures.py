"""The figure command in --quick mode: every figure, its CSV, and the index whose captions name what each was
simulated on."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIGS = [
    "fig04_footprint_flops",
    "fig05_baselines",
    "fig07_overlap",
    "fig10_confidence_layers",
    "fig12_overall",
    "fig13_gap_to_bound",
    "fig14_ttft_breakdown",
    "fig15_ablation",
    "fig16_batch_block",
    "fig17_cache_pcie",
    "fig18_policy_overhead",
]


@pytest.mark.slow
def test_quick_figures(tmp_path):
    out = tmp_path / "figs"
    p = subprocess.run(
        [sys.executable, str(ROOT / "notebooks" / "figures.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    for f in FIGS:
        for ext in ("png", "pdf", "csv"):
            assert (out / f"{f}.{ext}").stat().st_size > 0, f"{f}.{ext}"
    index = (out / "index.md").read_text()
    assert all(f in index for f in FIGS) and "Fig. 18a" in index
    rows = [line for line in index.splitlines() if line.startswith("| [fig")]
    assert len(rows) == len(FIGS)
    for row in rows:  # every caption names its traces, and each simulated figure its profile
        assert "traces `" in row, row
    assert all("profile `h100-mini`" in r for r in rows if "fig12" in r or "fig13" in r or "fig17" in r)
    # a rerun recomputes no simulation: every job's done.json is left as it was
    done = {f: f.stat().st_mtime_ns for f in (out / "_work" / "sweeps").glob("*/*/done.json")}
    assert len(done) > 20
    p = subprocess.run(
        [sys.executable, str(ROOT / "notebooks" / "figures.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0
    assert {f: f.stat().st_mtime_ns for f in done} == done
