"""The current validation claims are what the stored measurements give: ``validation/regenerate.sh`` run on a copy of
``validation/`` reproduces the committed report, and the docs state its numbers."""

from __future__ import annotations

import pytest

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_regenerate_reproduces_the_committed_report(tmp_path):
    work = tmp_path / "repo"
    shutil.copytree(ROOT / "validation", work / "validation")
    (work / "docs" / "img").mkdir(parents=True)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "MPLBACKEND": "Agg",
    }
    p = subprocess.run(
        ["bash", str(work / "validation" / "regenerate.sh")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    new = (work / "validation" / "h100" / "fidelity.md").read_text()
    assert new == (ROOT / "validation" / "h100" / "fidelity.md").read_text()
    # the numbers docs/validation.md and the README state are the report's
    mini = re.search(
        r"llada2-mini: TPOT median \|error\| ([\d.]+)%, max ([\d.]+)% over (\d+) runs; the simulator "
        r"orders (\d+) of (\d+)",
        new,
    )
    flash = re.search(
        r"llada2-flash: TPOT median \|error\| ([\d.]+)%, max ([\d.]+)% over (\d+) runs; the simulator "
        r"orders (\d+) of (\d+)",
        new,
    )
    assert mini and flash
    doc = (ROOT / "docs" / "validation.md").read_text()
    m, f = mini.groups(), flash.groups()
    assert f"| {m[2]} | {m[0]}% / {m[1]}% | {m[3]} of {m[4]} | equal |" in doc
    assert f"| {f[2]} | {f[0]}% / {f[1]}% | {f[3]} of {f[4]} | equal |" in doc
    readme = (ROOT / "README.md").read_text()
    assert f"within a median {m[0]}% and at most {m[1]}% over {m[2]} runs, with {m[3]} of {m[4]}" in readme
    home = " ".join((ROOT / "docs" / "index.md").read_text().split())
    assert f"within a median {m[0]}% and at most {m[1]}%, and ordered {m[3]} of {m[4]}" in home
