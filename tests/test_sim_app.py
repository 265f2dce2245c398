"""The `dllm-sim` app: main-job table, summary files, clean errors, multirun, collector, resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from dllm_offload_sim.sim.collect import collect
from dllm_offload_sim.sim.collect import main as collect_main

ROOT = Path(__file__).resolve().parent.parent
REQUIRED = [
    "policy",
    "cache",
    "pcie_gbps",
    "tpot_ms",
    "ttft_ms",
    "cache_util",
    "hit_rate",
    "h2d_gb",
    "cpu_experts",
    "sim_wall_s",
]


def run_sim(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "dllm_offload_sim.sim", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def test_table_mode_writes_summary(tmp_path):
    out = tmp_path / "run"
    p = run_sim(
        "table.policies=[naive_lru,oled,full_residency]",
        "trace.requests=[0]",
        "quiet=false",
        f"hydra.run.dir={out}",
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    t = pd.read_parquet(out / "summary.parquet")
    assert set(REQUIRED) <= set(t.columns)
    assert sorted(t.policy.unique()) == ["full_residency", "naive_lru", "oled"] and sorted(
        t.cache.unique()
    ) == [40, 100]
    assert (t[t.policy == "naive_lru"].speedup_vs_baseline == 1.0).all()
    assert "speedup_vs_naive_lru" in p.stdout and "oled" in p.stdout
    assert json.loads((out / "done.json").read_text())["runs"] == 6
    assert (out / "per_forward.parquet").is_file() and (out / "per_layer.parquet").is_file()
    # full residency never misses; oled beats naive LRU at cache 40 on the shipped trace
    assert (t[t.policy == "full_residency"].hit_rate == 1.0).all()
    c40 = t[t.cache == 40].set_index("policy")
    assert c40.loc["oled", "tpot_ms"] < c40.loc["naive_lru", "tpot_ms"]
    # a finished run of another simulator model (its config hash salted with another MODEL_VERSION) is not resumed
    from dllm_offload_sim.sim.engine import MODEL_VERSION

    done = json.loads((out / "done.json").read_text())
    assert done["model_version"] == MODEL_VERSION
    (out / "done.json").write_text(
        json.dumps({**done, "config_hash": "0" * 16, "model_version": MODEL_VERSION - 1})
    )
    p = run_sim(
        "table.policies=[naive_lru,oled,full_residency]",
        "trace.requests=[0]",
        f"hydra.run.dir={out}",
        cwd=tmp_path,
    )
    assert (
        p.returncode != 0 and "the simulator's model changed since" in p.stderr and "[resume]" not in p.stdout
    )


def test_the_config_hash_covers_what_else_the_results_depend_on():
    from hydra import compose, initialize_config_dir

    from dllm_offload_sim.wiring.build import CONF_DIR, config_hash

    with initialize_config_dir(str(CONF_DIR), version_base=None):
        cfg = compose("config")
    assert config_hash(cfg, salt="model 1") != config_hash(cfg, salt="model 2") != config_hash(cfg)


@pytest.mark.slow
def test_table_results_do_not_depend_on_worker_processes(tmp_path):
    """table.jobs=2 runs pairs of runs in worker processes; the summary equals the sequential one."""
    tabs = {}
    for jobs in (1, 2):
        out = tmp_path / f"j{jobs}"
        p = run_sim(
            "table.policies=[naive_lru,oled,tide]",
            "trace.requests=[0,1]",
            "trace=synthetic",
            f"table.jobs={jobs}",
            f"hydra.run.dir={out}",
            cwd=tmp_path,
        )
        assert p.returncode == 0, p.stderr
        tabs[jobs] = pd.read_parquet(out / "summary.parquet")
    timing = [
        c
        for c in tabs[1].columns
        if c.startswith(("sim_wall", "sim_layer", "policy_ms", "policy_us", "policy_hooks"))
    ]
    pd.testing.assert_frame_equal(tabs[1].drop(columns=timing), tabs[2].drop(columns=timing))
    assert list(tabs[2].policy) == ["naive_lru", "naive_lru", "oled", "oled", "tide", "tide"]
    p = run_sim("table.jobs=-1", "quiet=true", f"hydra.run.dir={tmp_path / 'bad'}", cwd=tmp_path)
    assert p.returncode == 2 and "table.jobs must be >= 0" in p.stderr


def test_bad_config_exits_2_with_message(tmp_path):
    p = run_sim("policy=lru", "cache=999", f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path)
    assert p.returncode != 0
    assert "error: cache=999 exceeds the 256 experts" in p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "r" / "done.json").exists()


def test_several_policies_in_one_run_name_the_table_and_the_multirun_instead(tmp_path):
    """``policy=[a,b]`` makes Hydra merge both policies' configs into one object: a clear error, nothing run."""
    p = run_sim("policy=[naive_lru,oled]", f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert "one run takes one policy" in p.stderr and "'table.policies=[naive_lru,oled]'" in p.stderr
    assert "-m policy=naive_lru,oled" in p.stderr
    assert not (tmp_path / "r" / "done.json").exists()


def test_help_lists_groups(tmp_path):
    p = run_sim("--help", cwd=tmp_path)
    assert p.returncode == 0 and "policy:" in p.stdout and "oled" in p.stdout


@pytest.mark.slow
def test_smoke_sweep_collect_and_resume(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    args = [
        "-m",
        "policy=lru,oled",
        "cache=20,40",
        "hw.pcie_gbps=32",
        "trace.requests=[0]",
        "quiet=true",
        f"hydra.sweep.dir={sweep}",
    ]
    p = run_sim(*args, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert f"sweep: 4 of 4 jobs done in {sweep}" in p.stdout  # one line for the whole sweep, quiet or not
    r = collect(sweep)
    table = r.table
    assert len(table) == 4 and r.complete and r.expected == 4
    assert set(table["override.policy"]) == {"lru", "oled"} and (table.pcie_gbps == 32).all()
    # the overrides as the values they set; quiet changes no result and is no column
    assert table["override.cache"].dtype.kind == "i" and table["override.hw.pcie_gbps"].dtype.kind == "i"
    assert "override.quiet" not in table
    assert "wrote" not in p.stdout and "tpot_ms" not in p.stdout  # no job's own table in the sweep's output
    assert collect_main([str(sweep)]) == 0 and (sweep / "all.parquet").is_file()
    printed = (
        capsys.readouterr().out.splitlines()
    )  # the merged table: the varying overrides, policy, cache, TPOT
    assert printed[0].split() == ["policy", "cache", "tpot_ms", "speedup_vs_baseline"] and len(printed) >= 5
    # a rerun into the same sweep dir recomputes nothing
    p = run_sim(*args, cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.count("[resume]") == 4
    # an interrupted job (no done.json) is reported and left out
    job = sweep / "0"
    (job / "done.json").unlink()
    r = collect(sweep)
    assert len(r.table) == 3 and r.incomplete == [job]
    assert collect_main([str(sweep)]) == 1
    assert collect_main([str(sweep), "--allow-incomplete"]) == 0
    # the same sweep dir with another trace: finished jobs are refused, not recomputed in place, and
    # collect tells their results from the new config's
    job1 = sweep / "1"
    before = (job1 / "summary.parquet").read_bytes()
    p = run_sim(*args, "trace.path=llada2_small_gsm8k_b16", cwd=tmp_path)  # (trace.path is not in job names)
    assert p.returncode != 0 and "holds a finished run of another config" in p.stderr
    assert (job1 / "summary.parquet").read_bytes() == before
    r = collect(sweep)
    assert job1 in r.stale and not r.complete
    # a job finished by another version of the simulator's model is stale too
    job2 = sweep / "2"
    done2 = json.loads((job2 / "done.json").read_text())
    (job2 / "done.json").write_text(json.dumps({**done2, "model_version": done2["model_version"] - 1}))
    assert job2 in collect(sweep).stale
    (job2 / "done.json").write_text(json.dumps(done2))
    # a job that never started (its folder gone) is named
    import shutil

    shutil.rmtree(job1)
    r = collect(sweep)
    assert r.missing == [1] and r.expected == 4


def test_sweep_speedups_are_against_the_baseline_of_the_same_setting():
    """One job per policy: each row's speedup is the baseline job's TPOT at the same cache and other
    overrides over its own; without a baseline run it stays NaN."""
    import numpy as np
    import pandas as pd

    from dllm_offload_sim.sim.collect import sweep_speedups

    t = pd.DataFrame(
        {
            "policy": ["naive_lru", "oled", "naive_lru", "oled", "oled"],
            "cache": [40, 40, 40, 40, 100],
            "tpot_ms": [10.0, 8.0, 20.0, 10.0, 5.0],
            "baseline": ["naive_lru"] * 5,
            "override.policy": ["naive_lru", "oled", "naive_lru", "oled", "oled"],
            "override.hw.pcie_gbps": ["16", "16", "32", "32", "32"],
            "speedup_vs_baseline": [np.nan] * 5,
        }
    )
    s = sweep_speedups(t).speedup_vs_baseline.tolist()
    assert s[:4] == [1.0, 1.25, 1.0, 2.0] and np.isnan(s[4])


def test_plot_a_sweep_table(tmp_path, capsys):
    """sim.plot draws y against x per hue and per column panel, sorted along x, as PNG and PDF; a column it
    lacks is a clear error naming the ones it has."""
    import pandas as pd

    from dllm_offload_sim.sim.plot import main as plot_main
    from dllm_offload_sim.traces.cli import run_cli

    t = pd.DataFrame(
        {
            "policy": ["a", "a", "b", "b"] * 2,
            "cache": [40] * 4 + [100] * 4,
            "pcie_gbps": [64.0, 16.0] * 4,
            "tpot_ms": [1.0, 3.0, 2.0, 4.0, 0.5, 1.5, 1.0, 2.0],
        }
    )
    src = tmp_path / "all.parquet"
    t.to_parquet(src)
    assert plot_main([str(src), "--x", "hw.pcie_gbps", "--col", "cache", "--out", str(tmp_path / "p")]) == 0
    assert (tmp_path / "p.png").stat().st_size > 1000 and (tmp_path / "p.pdf").is_file()
    assert run_cli(plot_main, [str(src), "--x", "nope"]) == 2
    assert "no column 'nope' in the table" in capsys.readouterr().err


def test_plot_orders_panels_and_lines_by_value_where_they_are_numbers():
    """An override column holds caches as text ("100", "40"): panels and lines come in numeric order, not text."""
    import pandas as pd

    from dllm_offload_sim.sim.plot import plot

    t = pd.DataFrame(
        {
            "override.cache": ["100", "40", "100", "40"],
            "override.seed": ["10", "10", "9", "9"],
            "pcie_gbps": [8.0, 8.0, 64.0, 64.0],
            "tpot_ms": [1.0, 2.0, 0.5, 1.0],
        }
    )
    fig = plot(t, "pcie_gbps", "tpot_ms", hue="seed", col="cache")
    assert [ax.get_title().rsplit(" = ", 1)[1] for ax in fig.axes] == ["40", "100"]
    assert [ln.get_label() for ln in fig.axes[0].get_lines()] == ["9", "10"]


def test_the_python_api_labels_a_policy_by_its_name():
    """run_table on a config composed through the Python API labels the row as the CLI does ('oled_priority'), not by
    its class (OLEDPolicy)."""
    from hydra import compose, initialize_config_dir

    from dllm_offload_sim.sim.app import run_table
    from dllm_offload_sim.wiring.build import CONF_DIR

    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        cfg = compose(
            config_name="config", overrides=["policy=oled_priority", "cache=40", "trace.requests=[0]"]
        )
    assert run_table(cfg, progress=False).policy.tolist() == ["oled_priority"]
