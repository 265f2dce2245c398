"""Sweep launchers: every shipped launcher config composes, and a sweep through submitit (the engine of the
SLURM launcher, run locally) and a sweep through Ray on a one-node cluster started by the test give the
joblib launcher's results."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from dllm_offload_sim.wiring.build import CONF_DIR

ROOT = Path(__file__).resolve().parent.parent
LAUNCHERS = sorted(p.stem for p in (CONF_DIR / "hydra" / "launcher").glob("*.yaml")) + ["submitit_local"]


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_every_launcher_composes(launcher):
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        cfg = compose(
            config_name="config",
            overrides=[f"hydra/launcher={launcher}", "policy=lru"],
            return_hydra_config=True,
        )
    assert cfg.hydra.launcher._target_.startswith("hydra_plugins.")


def run_sweep(out: Path, launcher: str, *extra: str, env: dict | None = None) -> pd.DataFrame:
    """A 4-job sweep (two policies x two caches, one request) through ``launcher``; its merged table without the
    wall-time columns, in a fixed order."""
    from dllm_offload_sim.sim.collect import collect

    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "dllm_offload_sim.sim",
            "-m",
            f"hydra/launcher={launcher}",
            "policy=naive_lru,oled",
            "cache=20,40",
            "trace.requests=[0]",
            "sim.per_forward=false",
            "quiet=true",
            f"hydra.sweep.dir={out}",
            *extra,
        ],
        cwd=out.parent,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    r = collect(out)
    assert r.complete and len(r.table) == 4
    wall = [
        c for c in r.table.columns if "wall" in c or c.startswith("policy_") or c == "sim_layer_execs_per_s"
    ]
    return r.table.drop(columns=wall).sort_values(["policy", "cache"]).reset_index(drop=True)


@pytest.fixture(scope="module")
def joblib_table(tmp_path_factory):
    return run_sweep(tmp_path_factory.mktemp("joblib") / "sweep", "local")


@pytest.mark.slow
def test_a_submitit_sweep_equals_the_joblib_sweep(tmp_path, joblib_table):
    pd.testing.assert_frame_equal(joblib_table, run_sweep(tmp_path / "sweep", "submitit_local"))


# A one-node Ray cluster for the test: this process starts it, prints its address, and keeps it up until its
# stdin closes (then ray.shutdown() stops every process it started, and nothing else).
RAY_HEAD = """
import sys, ray
ray.init(num_cpus=2, include_dashboard=False)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()
ray.shutdown()
"""


@pytest.mark.slow
def test_a_ray_sweep_on_a_local_cluster_equals_the_joblib_sweep(tmp_path, joblib_table):
    pytest.importorskip("ray")
    # token authentication with a token of the test's own (not the user's ~/.ray/auth_token)
    env = dict(
        os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32)
    )
    head = subprocess.Popen(
        [sys.executable, "-c", RAY_HEAD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        got = []
        reader = threading.Thread(target=lambda: got.append(head.stdout.readline().strip()), daemon=True)
        reader.start()
        reader.join(timeout=180)
        assert got and got[0], "the Ray head did not start within 180 s"
        table = run_sweep(tmp_path / "sweep", "ray", f"hydra.launcher.address={got[0]}", env=env)
    finally:
        head.stdin.close()
        try:
            head.wait(timeout=120)
        except subprocess.TimeoutExpired:
            head.kill()
    pd.testing.assert_frame_equal(joblib_table, table)


def test_the_ray_launcher_refuses_a_bad_cpu_reservation():
    from hydra_plugins.dllm_offload_ray.launcher import RayTasksLauncher

    with pytest.raises(ValueError, match=r"num_cpus_per_job must be > 0, got 0"):
        RayTasksLauncher(num_cpus_per_job=0)


def test_a_launcher_whose_plugin_is_missing_names_the_extra(monkeypatch):
    """hydra/launcher=slurm without hydra-submitit-launcher: one line naming the slurm extra, before Hydra runs."""
    import importlib.util

    from dllm_offload_sim.wiring import launchers

    real = importlib.util.find_spec
    monkeypatch.setattr(
        launchers.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "hydra_plugins.hydra_submitit_launcher" else real(name, *a),
    )
    msg = launchers.missing_launcher(["-m", "hydra/launcher=slurm", "policy=lru"])
    assert msg is not None and "pip install 'dllm-offload-sim[slurm]'" in msg
    assert launchers.missing_launcher(["hydra/launcher=local"]) is None
