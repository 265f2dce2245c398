"""Packaging: every console entry point resolves to a callable, and an installed one runs."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_entry_point_resolves(name):
    module, func = SCRIPTS[name].split(":")
    assert callable(getattr(importlib.import_module(module), func))


def test_an_installed_entry_point_runs():
    exe = Path(sys.executable).parent / "dllm-synth"
    if not exe.exists():
        pytest.skip("the project is not installed into this interpreter's environment")
    p = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "python -m traces.synth" in p.stdout


def test_packages_are_listed_exactly():
    """Only the project's own packages go into a wheel (a user's traces_out/ or sweeps/ never do)."""
    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    assert all(p.split(".")[0] in {"traces", "policies", "costmodel", "wiring", "sim", "models", "runtime",
                                   "profiler", "validate", "conf"} for p in found)
    assert not any(p.endswith("*") and "." not in p for p in found)
