"""The examples run as their docstrings say (with one request, to stay quick)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(script: str, *args: str, cwd: Path) -> str:
    p = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


@pytest.mark.slow
def test_custom_policy(tmp_path):
    out = run("custom_policy.py", "--requests", "0", cwd=tmp_path)
    assert out.count("fifo") == 2 and out.count("naive_lru") == 2


@pytest.mark.slow
def test_own_trace(tmp_path):
    out = run("own_trace.py", "--out", str(tmp_path / "t"), cwd=tmp_path)
    assert "adjacent-iteration overlap" in out and "oled" in out and (tmp_path / "t" / "meta.json").is_file()


@pytest.mark.slow
def test_pcie_sweep(tmp_path):
    out = run(
        "pcie_sweep.py", "--requests", "0", "--gbps", "16,64", "--out", str(tmp_path / "p.png"), cwd=tmp_path
    )
    assert "naive_lru" in out and (tmp_path / "p.png").stat().st_size > 1000


@pytest.mark.slow
def test_sglang_routed_experts(tmp_path):
    assert "made up" in run("sglang_routed_experts.py", "--demo", "dump.jsonl", cwd=tmp_path)
    assert "routed rows" in run("sglang_routed_experts.py", "dump.jsonl", "--out", "r.jsonl", cwd=tmp_path)
    assert (tmp_path / "r.jsonl").read_text().startswith('{"format": "dllm-routing", "version": 1')
