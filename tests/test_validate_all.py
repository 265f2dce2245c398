"""validate_all.sh, the whole validation on a GPU host: its budget (BUDGET_S) on the one step a CPU runs, the figure."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

from dllm_offload_sim.validate.comparison import COUNTERS

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "src" / "dllm_offload_sim" / "validate" / "validate_all.sh"


def _sweep(out: Path) -> None:
    """A finished mini sweep's table in ``out/mini``: two runs, TPOT and prefill, counters equal."""
    rows = []
    for pol, tp, tm in (("oled", 10.0, 10.4), ("naive_lru", 12.0, 12.3)):
        for met, p, m in (("tpot_ms", tp, tm), ("prefill_ms", 100.0, 104.0)):
            rows.append(
                {
                    "model": "llada2-mini",
                    "policy": pol,
                    "cache": 40,
                    "metric": met,
                    "predicted": p,
                    "measured": m,
                    "signed_rel_err": (p - m) / m,
                    "abs_rel_err": abs(p - m) / m,
                }
            )
        for c in COUNTERS:
            rows.append(
                {
                    "model": "llada2-mini",
                    "policy": pol,
                    "cache": 40,
                    "metric": c,
                    "predicted": 5.0,
                    "measured": 5.0,
                    "signed_rel_err": 0.0,
                    "abs_rel_err": 0.0,
                }
            )
    (out / "mini").mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(out / "mini" / "fidelity.parquet")


def _run(out: Path, **env) -> subprocess.CompletedProcess:
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return subprocess.run(
        ["bash", str(SCRIPT), str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PATH": path, "STEPS": "figure", **env},
    )


def test_a_spent_budget_skips_every_command_and_says_which(tmp_path):
    out = tmp_path / "v"
    _sweep(out)
    r = _run(out, BUDGET_S="0")
    assert r.returncode == 0, r.stderr
    assert "budget of 0 s is spent; skipped: dllm-fidelity-figure" in r.stderr
    assert "skipped: dllm-report" in r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["mini"]  # nothing written, the sweep's table untouched


def test_the_figure_step_within_its_budget_writes_the_figure_and_the_report(tmp_path):
    out = tmp_path / "v"
    _sweep(out)
    r = _run(out, BUDGET_S="600")
    assert r.returncode == 0, r.stderr
    assert (out / "fidelity.png").is_file() and (out / "fidelity.pdf").is_file()
    assert "| oled | 40 |" in (out / "fidelity.md").read_text()
    assert "budget" not in r.stderr
