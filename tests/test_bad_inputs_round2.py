"""The audit's second round of configs and arguments that measured nothing, ran unbounded or gave a traceback, each
now refused with the field and value (N-SC17, N-MS05, N-CF21, N-CF22, N-TR15, N-SC01, N-SC02, N-SC03, N-SC06)."""

from __future__ import annotations

import json
import shutil

import pytest

from dllm_offload_sim.sim.app import run_table
from dllm_offload_sim.traces.cli import run_cli
from dllm_offload_sim.traces.errors import TraceError
from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.traces.synth import SynthConfig, main as synth, write_synthetic_trace
from dllm_offload_sim.wiring.errors import ConfigError

from test_configs import _compose


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return write_synthetic_trace(
        SynthConfig(n_requests=2, max_new_tokens=16, seed=0), tmp_path_factory.mktemp("r") / "t"
    )


@pytest.mark.parametrize(
    "overrides,message",
    [
        pytest.param(
            ["policy=lru", "cache=40", "sim.warmup_requests=1", "sim.batch_size=2"],
            "measures nothing",
            id="N-SC17",
        ),
        pytest.param(
            ["table.policies=[lru,naive_lru]", "table.caches=[40]", "table.baseline=naive_lruu"],
            "table.baseline='naive_lruu' is not a policy",
            id="N-MS05",
        ),
        pytest.param(["table.caches=[]", "table.policies=[lru]"], "table.caches is empty", id="N-CF21"),
        pytest.param(["table.policies=[]"], "table.policies is empty", id="N-CF22"),
    ],
)
def test_a_config_that_would_measure_nothing_is_refused(trace, overrides, message):
    with pytest.raises(ConfigError, match=message):
        run_table(_compose(*overrides, f"trace.path={trace}"), progress=False)


def test_n_tr15_a_topology_field_of_the_wrong_type_is_named(trace, tmp_path):
    """N-TR15: meta model.n_experts "256" (a string)."""
    t = tmp_path / "t"
    shutil.copytree(trace, t)
    meta = json.loads((t / "meta.json").read_text())
    meta["model"]["n_experts"] = "256"
    (t / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(TraceError, match="n_experts='256' must be an integer"):
        Trace.open(t)


@pytest.mark.parametrize(
    "args,message",
    [
        pytest.param(
            ["--n-requests", "100000000"], "GB free; nothing was written", id="N-SC01"
        ),  # at 100x: more than any disk holds
        pytest.param(
            ["--n-requests", "1", "--max-new-tokens", "10000000000"],
            "GB free; nothing was written",
            id="N-SC02",
        ),  # at 100x
        pytest.param(
            ["--n-requests", "1", "--prompt-len-min", "10000000", "--prompt-len-max", "10000000"],
            "GiB of routing",
            id="N-SC03",
        ),
        pytest.param(["--seed", "-1"], "seed=-1", id="N-SC06"),
    ],
)
def test_synth_refuses_what_it_cannot_write_before_writing(tmp_path, capsys, args, message):
    assert run_cli(synth, [*args, "--out", str(tmp_path / "t"), "--quiet"]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing, not even a partial


def test_n_sw03_a_finished_run_whose_trace_tables_changed_is_run_again(tmp_path):
    """N-SW03: the resume fingerprint covers the trace's tables, not only its meta.json."""
    from dllm_offload_sim.wiring.build import config_hash

    a = write_synthetic_trace(SynthConfig(n_requests=2, max_new_tokens=16, seed=0), tmp_path / "a")
    b = write_synthetic_trace(SynthConfig(n_requests=2, max_new_tokens=16, seed=1), tmp_path / "b")
    cfg = _compose("policy=lru", "cache=40", f"trace.path={a}")
    before = config_hash(cfg)
    for name in ("steps.parquet", "routing.parquet", "tokens.parquet"):  # b's tables under a's meta.json
        shutil.copy(b / name, a / name)
    assert config_hash(cfg) != before


@pytest.mark.parametrize(
    "damage", [pytest.param("truncate", id="N-SW10"), pytest.param("delete", id="N-SW11")]
)
def test_a_finished_run_whose_summary_is_damaged_is_run_again(tmp_path, damage):
    """N-SW10, N-SW11: the same run again after its summary.parquet was truncated or deleted."""
    import subprocess
    import sys

    t = write_synthetic_trace(SynthConfig(n_requests=2, max_new_tokens=16, seed=0), tmp_path / "t")
    cmd = [
        sys.executable,
        "-m",
        "dllm_offload_sim.sim",
        "quiet=true",
        "policy=lru",
        "cache=40",
        f"trace.path={t}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    assert subprocess.run(cmd, capture_output=True, timeout=300).returncode == 0
    s = tmp_path / "run" / "summary.parquet"
    if damage == "truncate":
        s.write_bytes(s.read_bytes()[:300])
    else:
        s.unlink()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "running it again" in p.stderr, p.stderr[-1500:]
    import pandas as pd

    assert pd.read_parquet(s).tpot_ms.iloc[0] > 0


def test_n_sw02_a_second_launch_into_a_sweep_dir_takes_no_foreign_results(tmp_path, capsys):
    """N-SW02: a second sweep into the same directory with another trace and cache. Its job 0 meets the first
    launch's finished job 0 of another config and fails, naming it; collect merges nothing of either silently."""
    import subprocess
    import sys

    from dllm_offload_sim.sim.collect import main as collect

    a = write_synthetic_trace(SynthConfig(n_requests=2, max_new_tokens=16, seed=0), tmp_path / "a")
    b = write_synthetic_trace(SynthConfig(n_requests=2, max_new_tokens=16, seed=1), tmp_path / "b")
    rcs, errs = [], []
    for t, caches in ((a, "20,40"), (b, "60")):
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "dllm_offload_sim.sim",
                "-m",
                "quiet=true",
                f"trace.path={t}",
                "policy=lru",
                f"cache={caches}",
                f"hydra.sweep.dir={tmp_path / 'sw'}",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
        )
        rcs.append(p.returncode)
        errs.append(p.stderr)
    assert rcs == [0, 1] and "finished run of another config" in errs[1]
    assert run_cli(collect, [str(tmp_path / "sw")]) == 1
    err = capsys.readouterr().err
    assert "stale" in err and "left out, from an earlier launch into this directory (trace.path=" in err


def test_n_ms07_collect_names_a_damaged_multirun_yaml(tmp_path, capsys):
    """N-MS07."""
    from dllm_offload_sim.sim.collect import main as collect

    (tmp_path / "sw").mkdir()
    (tmp_path / "sw" / "multirun.yaml").write_text("hydra: [oops\n")
    assert run_cli(collect, [str(tmp_path / "sw")]) == 2
    assert "multirun.yaml: unreadable" in capsys.readouterr().err


def test_n_cf33_an_empty_trace_path_is_named(tmp_path):
    """N-CF33: trace.path=''."""
    from dllm_offload_sim.traces.shipped import resolve_trace

    with pytest.raises(TraceError, match="the trace path is empty"):
        resolve_trace("")


def test_n_mg05_n_mg02_profile_merge_refuses_one_file_twice_and_two_hosts(tmp_path, capsys):
    """N-MG05, N-MG02."""
    from dllm_offload_sim.costmodel.merge import main as merge
    from dllm_offload_sim.costmodel.profile import PROFILE_DIR

    src = PROFILE_DIR / "h100-mini.measured.json"
    assert run_cli(merge, [str(src), str(src), "--out", str(tmp_path / "m.json")]) == 2
    assert "given more than once" in capsys.readouterr().err
    d = json.loads(src.read_text())
    d["stamp"] = {**d["stamp"], "cpu_model": "AMD EPYC", "host": "other-box"}
    other = tmp_path / "other.json"
    other.write_text(json.dumps(d))
    assert run_cli(merge, [str(src), str(other), "--out", str(tmp_path / "m.json")]) == 2
    assert "stamp.cpu_model" in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()


def test_n_co07_train_refuses_a_budget_that_is_no_budget():
    """N-CO07: --budget-s -1 (and 0) is refused before anything runs."""
    from dllm_offload_sim.traces.cli import positive_float

    import argparse

    for bad in ("-1", "0", "nan"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive_float(bad)
    assert positive_float("270") == 270.0


def _sweep(tmp_path, *overrides):
    import subprocess
    import sys

    t = write_synthetic_trace(SynthConfig(n_requests=2, max_new_tokens=16, seed=0), tmp_path / "t")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "dllm_offload_sim.sim",
            "-m",
            "quiet=true",
            f"trace.path={t}",
            "policy=lru",
            f"hydra.sweep.dir={tmp_path / 'sw'}",
            *overrides,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_sweep_one_bad_value_fails_its_job_only(tmp_path, capsys):
    """A sweep case of the reliability issue: -m cache=forty,40 runs the cache=40 job, lists the failed one, exits 1."""
    from dllm_offload_sim.sim.collect import main as collect

    p = _sweep(tmp_path, "cache=forty,40")
    assert p.returncode == 1 and "failed job 0: cache must be an integer, got 'forty'" in p.stderr
    assert (tmp_path / "sw" / "1" / "done.json").is_file() and (
        tmp_path / "sw" / "0" / "failed.json"
    ).is_file()
    assert run_cli(collect, [str(tmp_path / "sw")]) == 1
    assert "failed: cache must be an integer" in capsys.readouterr().err


def test_n_sw21_long_and_path_valued_overrides_make_no_long_or_nested_job_folders(tmp_path, capsys):
    """The other sweep case (File name too long) and N-SW21 (hw.profile=/abs/path.json nested the job folders)."""
    from dllm_offload_sim.costmodel.profile import PROFILE_DIR
    from dllm_offload_sim.sim.collect import main as collect

    prof = tmp_path / ("a" * 200) / "p.json"
    prof.parent.mkdir()
    shutil.copy(PROFILE_DIR / "h100-mini.measured.json", prof)
    p = _sweep(tmp_path, "cache=20,40", f"hw.profile={prof}", f"+note={'x' * 300}")
    assert p.returncode == 0, p.stderr[-1500:]
    assert sorted(d.name for d in (tmp_path / "sw").iterdir() if d.is_dir()) == ["0", "1"]
    assert run_cli(collect, [str(tmp_path / "sw")]) == 0


def test_o_tr16_a_topology_matching_no_preset_names_the_field_that_differs(trace, tmp_path):
    """O-TR16: meta top_k 6 (the lists hold 8) was blamed on "neither mini nor flash" without naming top_k."""
    from dllm_offload_sim.wiring.build import shape_of

    t = tmp_path / "t"
    shutil.copytree(trace, t)
    meta = json.loads((t / "meta.json").read_text())
    meta["model"]["top_k"] = 6
    (t / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(
        ConfigError, match="matches no catalogue model \\(closest, mini: top_k=6 where it has 8"
    ):
        shape_of(Trace.open(t))


def test_n_tr08_a_meta_without_schema_version_is_named(trace, tmp_path):
    """N-TR08: meta.json without schema_version was answered "top level must be a JSON object"."""
    t = tmp_path / "t"
    shutil.copytree(trace, t)
    meta = json.loads((t / "meta.json").read_text())
    del meta["schema_version"]
    (t / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(
        TraceError, match=r"meta.json, column 'schema_version': missing; this reader understands 1"
    ):
        Trace.open(t)


def test_n_out01_an_output_folder_that_cannot_be_made_is_one_line(trace, tmp_path):
    """N-OUT01: hydra.run.dir where no folder can be made (there a read-only file system; here a path through a
    file, the same failure of Hydra's mkdir): one line naming the key, the path and the reason, exit 2."""
    import subprocess
    import sys

    (tmp_path / "a_file").write_text("mine")
    for key, mode in (("hydra.run.dir", []), ("hydra.sweep.dir", ["-m"])):
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "dllm_offload_sim.sim",
                *mode,
                "quiet=true",
                "policy=lru",
                "cache=40",
                f"trace.path={trace}",
                f"{key}={tmp_path / 'a_file' / 'run'}",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-1500:]
        assert (
            f"error: {key}={tmp_path / 'a_file' / 'run'}: cannot create the output folder: Not a directory"
            in p.stderr
        )
    assert (tmp_path / "a_file").read_text() == "mine"
