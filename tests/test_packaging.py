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
    assert p.returncode == 0 and "dllm-synth" in p.stdout


def test_packages_are_listed_exactly():
    """One namespaced package (and its Hydra launcher plugin) from ``src/`` goes into a wheel: a user's
    traces_out/ or sweeps/ never do, and no generic top-level name lands in site-packages."""
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    from setuptools import find_namespace_packages

    pkgs = find_namespace_packages(where=str(ROOT / find["where"][0]), include=find["include"])
    assert {p.split(".")[0] for p in pkgs} == {"dllm_offload_sim", "hydra_plugins"}
    assert {p for p in pkgs if p.startswith("hydra_plugins")} == {
        "hydra_plugins.dllm_offload_ray",
        "hydra_plugins.dllm_offload_conf",
    }
    assert {"dllm_offload_sim.sim", "dllm_offload_sim.conf", "dllm_offload_sim.traces"} <= set(pkgs)


def test_a_command_whose_extra_is_missing_names_the_extra():
    """Without torch, dllm-e2e (and its --help) says which extra to install, in the wheel's terms, not a traceback."""
    code = (
        "import sys; sys.modules['torch'] = None; sys.argv = ['dllm-e2e', '--help']\n"
        "from dllm_offload_sim.commands import e2e; e2e()"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-1500:]
    assert "pip install 'dllm-offload-sim[gpu]'" in p.stderr


def test_dllm_profile_without_torch_helps_refits_and_names_the_extra_to_measure(tmp_path):
    """Without torch, dllm-profile's --help and --refit run (they need none), and measuring names the extra."""
    prelude = "import sys; sys.modules['torch'] = None; from dllm_offload_sim.profiler.__main__ import main\n"

    def run(*argv):
        code = prelude + f"sys.exit(main({list(argv)!r}))"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)

    h = run("--help")
    assert h.returncode == 0 and "--refit" in h.stdout, h.stderr[-1500:]
    out = tmp_path / "refit.json"
    r = run("--refit", "h200-mini", "--out", str(out))
    assert r.returncode == 0 and out.exists(), r.stderr[-1500:]
    m = run("--model", "mini")
    assert m.returncode == 2 and "Traceback" not in m.stderr, m.stderr[-1500:]
    assert "pip install 'dllm-offload-sim[gpu]'" in m.stderr
