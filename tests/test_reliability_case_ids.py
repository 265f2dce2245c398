"""Every case of the reliability audit (``shared/audits/reliability-cases.md``, round 2) has a test named after its
id: the test's name, or its parameter's id, holds the case id (``N-OUT09`` as ``n_out09`` or ``N-OUT09``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CASE_IDS = (
    "N-OUT01 N-OUT09 N-OUT10 N-OUT15 N-OUT19 N-OUT20 "
    "N-SW02 N-SW03 N-SW10 N-SW11 N-SW13 N-SW21 "
    "N-TR08 N-TR15 N-TR23 N-TR27 N-TR28 N-TR29 N-TR37 N-TR39 "
    "N-PR05 N-PR06 N-PR07 N-PR09 N-PR10 N-PR12 N-PR13 N-PR16 N-PR17 N-PR27 "
    "N-MG02 N-MG05 N-MS05 N-MS07 N-SC01 N-SC02 N-SC03 N-SC06 N-SC17 "
    "N-CF21 N-CF22 N-CF33 N-CO07 O-TR16 O-TB04"
).split()


def _key(s: str) -> str:
    return s.lower().replace("-", "_")


def test_every_case_id_has_a_test_named_after_it():
    tests = Path(__file__).resolve().parent
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-m",
            "slow or not slow",
            "-p",
            "no:cacheprovider",
            str(tests),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tests.parent,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    node_ids = _key(p.stdout)
    missing = [c for c in CASE_IDS if _key(c) not in node_ids]
    assert len(CASE_IDS) == 45 and not missing, missing
