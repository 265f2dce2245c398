"""Sweep launchers: every shipped launcher config composes, and a sweep through submitit (the engine of the
SLURM launcher, run locally) gives the joblib launcher's results."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from wiring.build import CONF_DIR

ROOT = Path(__file__).resolve().parent.parent
LAUNCHERS = sorted(p.stem for p in (CONF_DIR / "hydra" / "launcher").glob("*.yaml")) + ["submitit_local"]


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_every_launcher_composes(launcher):
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        cfg = compose(config_name="config", overrides=[f"hydra/launcher={launcher}", "policy=lru"],
                      return_hydra_config=True)
    assert cfg.hydra.launcher._target_.startswith("hydra_plugins.")


@pytest.mark.slow
def test_a_submitit_sweep_equals_the_joblib_sweep(tmp_path):
    from sim.collect import collect

    def sweep(launcher):
        out = tmp_path / launcher
        p = subprocess.run([sys.executable, "-m", "sim", "-m", f"hydra/launcher={launcher}", "policy=naive_lru,oled",
                            "cache=20,40", "trace.requests=[0]", "sim.per_forward=false", "quiet=true",
                            f"hydra.sweep.dir={out}"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
        r = collect(out)
        assert r.complete and len(r.table) == 4
        wall = [c for c in r.table.columns if "wall" in c or c.startswith("policy_") or c == "sim_layer_execs_per_s"]
        return r.table.drop(columns=wall).sort_values(["policy", "cache"]).reset_index(drop=True)

    pd.testing.assert_frame_equal(sweep("local"), sweep("submitit_local"))
