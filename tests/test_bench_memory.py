"""bench/bench_memory.py: the peak memory of one simulation as the trace grows, each in a process of its own."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[1] / "bench" / "bench_memory.py"


@pytest.mark.slow
def test_the_bench_reports_a_peak_for_each_trace_length(tmp_path):
    out = subprocess.run(
        [sys.executable, str(BENCH), "--model", "mini", "--requests", "2", "--tokens", "32",
         "--policies", "naive_lru", "--trace", str(tmp_path / "t"), "--keep", "--allocator", "both"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rows = re.findall(
        r"naive_lru +(\d+) requests \( *(\d+) forwards\), allocator +(\S+): peak +(\d+) MB", out
    )
    assert [(int(n), a) for n, _, a, _ in rows] == [
        (1, "dllm-sim"), (1, "default"), (2, "dllm-sim"), (2, "default")
    ], out  # fmt: skip
    rows = [(n, f, mb) for n, f, _, mb in rows[::2]]
    assert int(rows[1][1]) > int(rows[0][1]) > 0  # the longer trace has more forwards
    assert all(100 < int(mb) < 4000 for _, _, mb in rows), (
        out
    )  # a Python process with numpy, pandas and numba
    assert (tmp_path / "t" / "meta.json").exists()  # --keep: the trace stays where --trace names


def test_the_bench_refuses_a_trace_folder_without_a_trace(tmp_path):
    (tmp_path / "empty").mkdir()
    r = subprocess.run(
        [sys.executable, str(BENCH), "--trace", str(tmp_path / "empty")], capture_output=True, text=True
    )
    assert r.returncode == 2 and "has no meta.json" in r.stderr and "--keep" in r.stderr
