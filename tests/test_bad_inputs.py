"""Bad input and faults, as a hostile-but-realistic user meets them: every case ends in one clear ``error:``
line (exit status 2), never a traceback, and nothing that existed before is changed."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from dllm_offload_sim.traces.cli import run_cli
from dllm_offload_sim.wiring.build import CONF_DIR
from dllm_offload_sim.wiring.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def call(main, argv: list[str], capsys) -> tuple[int, str]:
    """Run a command's main in-process as its ``__main__`` does; (exit status, stderr)."""
    try:
        code = run_cli(main, argv)
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    return code, capsys.readouterr().err


def tree_digest(path: Path) -> str:
    """A hash of every file under ``path`` (names and bytes): equal before and after = nothing changed."""
    h = hashlib.sha256()
    for f in sorted(p for p in Path(path).rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


@pytest.fixture
def user_dir(tmp_path):
    """A user's folder with work of their own in it (never a trace)."""
    d = tmp_path / "work"
    (d / "notes").mkdir(parents=True)
    (d / "notes" / "paper.tex").write_text("\\section{Results}")
    (d / "data.csv").write_text("a,b\n1,2\n")
    return d


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    from dllm_offload_sim.traces.synth import SynthConfig, write_synthetic_trace

    return write_synthetic_trace(
        SynthConfig(n_requests=2, max_new_tokens=16, seed=3), tmp_path_factory.mktemp("tr") / "t"
    )


# ---- traces.synth / traces.subset / traces.stats: where they write ---------------------------------------
def _synth(argv, capsys):
    from dllm_offload_sim.traces.synth import main

    return call(main, ["--n-requests", "1", "--max-new-tokens", "8", "--quiet", *argv], capsys)


def test_overwrite_never_deletes_a_folder_that_is_not_a_trace(user_dir, capsys):
    before = tree_digest(user_dir)
    code, err = _synth(["--out", str(user_dir), "--overwrite"], capsys)
    assert code == 2 and "is not a trace directory (no meta.json) and not empty" in err
    assert tree_digest(user_dir) == before


def test_an_existing_trace_is_kept_without_overwrite(small_trace, capsys):
    before = tree_digest(small_trace)
    code, err = _synth(["--out", str(small_trace)], capsys)
    assert code == 2 and "already exists; refusing to write over it" in err
    assert tree_digest(small_trace) == before


def test_overwrite_replaces_a_trace_and_an_empty_folder(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _synth(["--out", str(empty), "--overwrite"], capsys)[0] == 0 and (empty / "meta.json").is_file()
    assert _synth(["--out", str(empty), "--overwrite", "--seed", "5"], capsys)[0] == 0


@pytest.mark.parametrize("where", ["cwd", "parent", "home"])
def test_out_naming_the_current_parent_or_home_directory_is_refused(tmp_path, monkeypatch, capsys, where):
    cwd = tmp_path / "a" / "b"
    cwd.mkdir(parents=True)
    (cwd / "keep.txt").write_text("x")
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HOME", str(tmp_path / "a"))
    out = {"cwd": ".", "parent": "..", "home": str(tmp_path / "a")}[where]
    before = tree_digest(tmp_path)
    code, err = _synth(["--out", out, "--overwrite"], capsys)
    assert code == 2 and "is the current directory, one above it or the home directory" in err
    assert tree_digest(tmp_path) == before


def test_out_naming_a_file_is_refused(tmp_path, capsys):
    f = tmp_path / "results.parquet"
    f.write_bytes(b"PAR1 not mine to lose")
    code, err = _synth(["--out", str(f), "--overwrite"], capsys)
    assert code == 2 and "is a file, not a directory" in err and f.read_bytes() == b"PAR1 not mine to lose"


def test_subset_out_naming_a_file_is_refused(small_trace, tmp_path, capsys):
    from dllm_offload_sim.traces.subset import main

    f = tmp_path / "x"
    f.write_text("mine")
    code, err = call(main, [str(small_trace), str(f), "--first", "1"], capsys)
    assert code == 2 and "is a file" in err and f.read_text() == "mine"


def test_subset_of_a_missing_trace(tmp_path, capsys):
    from dllm_offload_sim.traces.subset import main

    code, err = call(main, [str(tmp_path / "nope"), str(tmp_path / "out"), "--first", "1"], capsys)
    assert code == 2 and "nope" in err and not (tmp_path / "out").exists()


def _stats(argv, capsys):
    from dllm_offload_sim.traces.stats import main

    return call(main, [*argv, "--no-plots", "--quiet"], capsys)


@pytest.mark.parametrize(
    "flag, value", [("--requests", "0"), ("--requests", "-1"), ("--requests", "two"), ("--max-gap", "0")]
)
def test_stats_refuses_counts_that_are_not_positive(small_trace, tmp_path, capsys, flag, value):
    code, err = _stats([str(small_trace), flag, value, "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and f"argument {flag}: must be an integer >= 1" in err and not (tmp_path / "o").exists()


def test_stats_of_an_empty_trace(tmp_path, capsys):
    from dllm_offload_sim.traces.topology import topology_preset
    from dllm_offload_sim.traces.writer import write_trace

    p = write_trace(
        tmp_path / "empty",
        topology_preset("mini"),
        [],
        "synthetic",
        {"block_length": 16, "threshold": 0.9, "max_new_tokens": 8},
        "none",
    )
    code, err = _stats([str(p), "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "holds no requests; nothing to analyse" in err


def test_stats_out_naming_a_file(small_trace, tmp_path, capsys):
    f = tmp_path / "o"
    f.write_text("mine")
    code, err = _stats([str(small_trace), "--out", str(f)], capsys)
    assert code == 2 and "is a file; --out names the folder" in err and f.read_text() == "mine"


def test_stats_of_an_unknown_trace(capsys):
    code, err = _stats(["no_such_trace_name"], capsys)
    assert code == 2 and "no_such_trace_name" in err


# ---- a full disk, a killed writer ------------------------------------------------------------------------
def _tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
        ).returncode
        == 0
    )


def test_a_full_disk_is_a_clear_error_and_leaves_nothing_behind(tmp_path, monkeypatch, capsys):
    """On a 256 KiB tmpfs where one can be mounted, else with every write failing with ENOSPC."""
    disk = tmp_path / "disk"
    mounted = _tmpfs(disk, "256k")
    try:
        if not mounted:
            import pyarrow.parquet as pq

            def full(*a, **k):
                raise OSError(errno.ENOSPC, "No space left on device", str(disk / "t"))

            monkeypatch.setattr(pq, "write_table", full)
        from dllm_offload_sim.traces import synth
        from dllm_offload_sim.traces.synth import main

        # past the size estimate (which refuses this before writing, tests/test_bad_inputs_round2.py): the writes fail
        monkeypatch.setattr(synth, "expected_size", lambda cfg, topo: (0.0, 0.0))
        code, err = call(
            main, ["--out", str(disk / "t"), "--n-requests", "8", "--max-new-tokens", "64", "--quiet"], capsys
        )
        assert code == 2 and "no space left on device" in err and "Traceback" not in err
        assert not (disk / "t").exists() and list(disk.iterdir()) == []  # no partial directory left
    finally:
        if mounted:
            subprocess.run(["umount", str(disk)], capture_output=True)


@pytest.mark.slow
def test_the_simulator_on_a_full_disk(tmp_path):
    """``dllm-sim`` into a 20 KiB tmpfs (where one can be mounted): one error line naming the file, exit 2,
    and no half-written table; the run directory has no done.json, so nothing takes it for complete."""
    disk = tmp_path / "disk"
    if not _tmpfs(disk, "20k"):
        pytest.skip("no tmpfs can be mounted here (the in-process ENOSPC case above covers the writer)")
    try:
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "dllm_offload_sim.sim",
                "policy=oled",
                "trace.requests=[0]",
                "quiet=true",
                f"hydra.run.dir={disk / 'run'}",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert p.returncode == 2 and "no space left on device" in p.stderr and "Traceback" not in p.stderr
        assert ".parquet: no space left" in p.stderr  # the file it could not write
        assert not (disk / "run" / "done.json").exists() and not (disk / "run" / "summary.parquet").exists()
        assert not list((disk / "run").glob(".*.tmp"))
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def test_a_writer_killed_leaves_a_partial_that_the_next_write_removes(tmp_path):
    from dllm_offload_sim.traces.atomic import atomic_directory

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(dead.stdout)  # a process that has exited
    stale = tmp_path / f".t.{pid}.abc.partial"
    stale.mkdir()
    (stale / "steps.parquet").write_bytes(b"x" * 1000)
    live = tmp_path / f".t.{os.getpid()}.def.partial"  # a writer still running (this process) is left alone
    live.mkdir()
    with atomic_directory(tmp_path / "t") as d:
        (d / "meta.json").write_text("{}")
    assert not stale.exists() and live.exists() and (tmp_path / "t" / "meta.json").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["TERM", "KILL"])
def test_killing_a_writer_never_leaves_a_trace_that_looks_complete(tmp_path, sig):
    """traces.synth killed at seeded random points: the trace is either absent or complete and valid, a
    SIGTERM leaves no partial folder, and a rerun finishes."""
    import signal
    import time

    from dllm_offload_sim.traces.reader import Trace

    rng = np.random.default_rng(7)
    out = tmp_path / "t"
    cmd = [
        sys.executable,
        "-m",
        "dllm_offload_sim.traces.synth",
        "--out",
        str(out),
        "--n-requests",
        "6",
        "--max-new-tokens",
        "128",
        "--quiet",
    ]
    for delay in rng.uniform(0.5, 3.0, 3):
        p = subprocess.Popen(cmd, cwd=ROOT)
        time.sleep(delay)
        p.send_signal(getattr(signal, f"SIG{sig}"))
        p.wait(timeout=60)
        if out.exists():
            Trace.open(out).validate()  # complete and valid, or not there at all
            shutil.rmtree(out)
        if sig == "TERM":
            assert not list(tmp_path.glob(".t.*")), "SIGTERM left a partial folder"
    assert subprocess.run(cmd, cwd=ROOT, timeout=300).returncode == 0
    Trace.open(out).validate()
    assert not list(tmp_path.glob(".t.*"))  # the killed writers' partials were removed


@pytest.mark.slow
def test_a_killed_sweep_is_never_collected_as_complete_and_resumes(tmp_path):
    """A sweep SIGKILLed at seeded random points after its first job started, three times: whatever it left,
    collect calls it complete only when every launched job finished with its own config's results; a rerun
    then finishes it."""
    import signal
    import time

    from dllm_offload_sim.sim.collect import collect
    from dllm_offload_sim.sim.collect import main as collect_main

    sweep = tmp_path / "sweep"
    cmd = [
        sys.executable,
        "-m",
        "dllm_offload_sim.sim",
        "-m",
        "policy=naive_lru,oled",
        "cache=20,40,60,100",
        "trace.requests=[0]",
        "sim.per_forward=false",
        "quiet=true",
        f"hydra.sweep.dir={sweep}",
        "hydra.launcher.n_jobs=1",
    ]
    killed_inside = 0
    for delay in np.random.default_rng(3).uniform(0, 3, 3):
        p = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # wait for the sweep's first job to start (at most a minute), then kill it a bit later
        t0 = time.monotonic()
        while not list(sweep.glob("*/.hydra")) and time.monotonic() - t0 < 60 and p.poll() is None:
            time.sleep(0.1)
        time.sleep(float(delay))
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=60)
        r = collect(sweep) if sweep.is_dir() else None
        if r is None:
            continue
        assert r.complete == (len(r.table) == 8 and r.expected == 8)
        assert collect_main([str(sweep), "--out", str(tmp_path / "all.parquet")]) == (0 if r.complete else 1)
        killed_inside += not r.complete
    assert killed_inside, "no kill landed inside the sweep; the test checked nothing"
    assert subprocess.run(cmd, cwd=tmp_path, capture_output=True, timeout=600).returncode == 0
    r = collect(sweep)
    assert r.complete and len(r.table) == 8


# ---- profiles -----------------------------------------------------------------------------------------------
def test_merge_never_overwrites_without_overwrite(tmp_path, capsys):
    from dllm_offload_sim.costmodel.merge import main

    out = tmp_path / "m.json"
    out.write_text('{"mine": true}')
    code, err = call(main, ["h200-mini", "h200-mini", "--out", str(out)], capsys)
    assert (
        code == 2
        and "already exists; refusing to write over it" in err
        and out.read_text() == '{"mine": true}'
    )


@pytest.mark.parametrize("value", ["-1", "nan", "x"])
def test_compare_refuses_a_bad_tolerance(value, capsys):
    from dllm_offload_sim.costmodel.compare import main

    code, err = call(main, ["h200-mini", "h200-mini", "--tolerance", value], capsys)
    assert code == 2 and "argument --tolerance: must be a number >= 0" in err


def test_compare_of_a_missing_profile(tmp_path, capsys):
    from dllm_offload_sim.costmodel.compare import main

    code, err = call(main, [str(tmp_path / "nope.json"), "h200-mini"], capsys)
    assert code == 2 and "nope.json" in err


# ---- the simulator's configuration -------------------------------------------------------------------------
def _cfg(*overrides):
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        return compose(
            config_name="config", overrides=["trace.requests=[0]", "sim.per_forward=false", *overrides]
        )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["policy=lru", "cache=40.5"], r"cache must be an integer, got 40\.5"),
        (["policy=lru", "cache=abc"], r"cache must be an integer, got 'abc'"),
        (["policy=lru", "cache=true"], r"cache must be an integer, got True"),
        (["policy=lru", "cache=-1"], r"cache must be >= 0, got -1"),
        (["table.caches=[40,40.5]"], r"table\.caches\[1\] must be an integer, got 40\.5"),
        (["policy=lru", "trace.requests=1"], r"trace\.requests must be a list such as \[0, 1\], got 1"),
        (["policy=lru", "trace.requests=[0,0]"], r"trace\.requests lists \[0\] more than once"),
        (["policy=lru", "trace.requests=[-1]"], r"trace\.requests\[0\] must be >= 0, got -1"),
        (["policy=lru", "trace.requests=[0,99]"], r"has no requests \[99\]"),
        (["policy=lru", "trace.requests=[]"], r"no requests to replay"),
        (["policy=lru", "sim.batch_size=4"], r"sim\.batch_size=4 exceeds the 1 requests replayed"),
        (["policy=lru", "sim.batch_size=0"], r"sim\.batch_size must be >= 1, got 0"),
        (["policy=lru", "sim.batch_size=1.5"], r"sim\.batch_size must be an integer, got 1\.5"),
        (["policy=lru", "sim.warmup_requests=1"], r"sim\.warmup_requests=1 must leave at least one"),
        (["policy=lru", "hw.cpu_workers=0"], r"hw\.cpu_workers must be >= 1, got 0"),
        (["policy=lru", "hw.profile=null"], r"hw\.profile must name a profile"),
        (["policy=lru", "hw.profile=no_such_profile"], r"no shipped profile named 'no_such_profile'"),
        (["policy=lru", "hw.pcie_gbps=0"], r"pcie_gbps"),
        (["table.policies=[lru,mine]"], r"unknown policy 'mine'"),
        (["table.jobs=-1"], r"table\.jobs must be >= 0 \(0 = one per CPU core\), got -1"),
        (["table.jobs=two"], r"table\.jobs must be an integer, got 'two'"),
        (["policy=oled", "policy.psi=cube"], r"psi must be one of"),
        (["policy=lru", "cache=300"], r"cache=300 exceeds the 256 experts"),
    ],
)
def test_simulator_configs_that_cannot_hold(overrides, message):
    from dllm_offload_sim.costmodel.profile import ProfileError
    from dllm_offload_sim.sim.app import run_table

    with pytest.raises((ConfigError, ProfileError), match=message):
        run_table(_cfg(*overrides), progress=False)


@pytest.mark.slow
@pytest.mark.parametrize("override", ["cache=abc", "trace.requests=1"])
def test_the_simulator_app_prints_an_error_not_a_traceback(tmp_path, override):
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "dllm_offload_sim.sim",
            "policy=lru",
            override,
            "quiet=true",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 2 and p.stderr.startswith("error: ") and "Traceback" not in p.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "override, message",
    [
        (
            "validate.cpu_engine=numpy",
            "validate.cpu_engine='numpy': expected null (the profile's) or one of auto, torch, kt",
        ),
        ("validate.repeats=0", "validate.repeats must be >= 1, got 0"),
    ],
)
def test_the_validator_refuses_a_bad_setting_before_anything_runs(tmp_path, override, message):
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "dllm_offload_sim.validate",
            "policy=lru",
            override,
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 2 and p.stderr.startswith("error: ") and message in p.stderr, p.stderr[-2000:]


def test_collect_of_a_missing_sweep(tmp_path, capsys):
    from dllm_offload_sim.sim.collect import main

    code, err = call(main, [str(tmp_path / "nope")], capsys)
    assert code == 2 and "no such sweep directory" in err


# ---- figures --------------------------------------------------------------------------------------------------
def _figures_main():
    from tests.simkit import script_module

    return script_module("notebooks/figures.py").main


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--jobs", "0"], "argument --jobs: must be an integer >= 1, got 0"),
        (["--jobs", "-2"], "argument --jobs: must be an integer >= 1"),
    ],
)
def test_figures_refuses_bad_job_counts(argv, message, capsys):
    code, err = call(_figures_main(), ["--quick", *argv], capsys)
    assert code == 2 and message in err


def test_figures_out_naming_a_file(tmp_path, capsys):
    f = tmp_path / "figs"
    f.write_text("mine")
    code, err = call(_figures_main(), ["--quick", "--out", str(f)], capsys)
    assert (
        code == 2 and "is a file; --out names the folder for the figures" in err and f.read_text() == "mine"
    )


# ---- checkpoints and the end-to-end mode -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    import torch

    from dllm_offload_sim.models.llada2.config import LLaDA2Config
    from dllm_offload_sim.models.llada2.loader import save_checkpoint
    from dllm_offload_sim.models.llada2.modeling import LLaDA2MoeModelLM

    torch.manual_seed(0)
    cfg = LLaDA2Config(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        first_k_dense_replace=1,
        num_experts=8,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        mask_token_id=299,
        eos_token_id=298,
        pad_token_id=297,
    )
    return save_checkpoint(LLaDA2MoeModelLM(cfg).eval(), tmp_path_factory.mktemp("ck") / "ckpt")


def test_a_truncated_shard_is_named(tiny_ckpt, tmp_path):
    from dllm_offload_sim.models.llada2.config import CheckpointError
    from dllm_offload_sim.models.llada2.loader import load_checkpoint

    bad = tmp_path / "bad"
    shutil.copytree(tiny_ckpt, bad)
    shard = next(bad.glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"cannot be read as safetensors .*truncated or corrupt"):
        load_checkpoint(bad)


def test_nan_router_weights_stop_decoding_with_a_clear_error(tiny_ckpt):
    import torch

    from dllm_offload_sim.models.llada2.config import CheckpointError
    from dllm_offload_sim.models.llada2.decode import generate
    from dllm_offload_sim.models.llada2.loader import load_checkpoint

    model = load_checkpoint(tiny_ckpt)
    with torch.no_grad():
        model.moe_layers()[0].gate.weight.fill_(float("nan"))
    with pytest.raises(CheckpointError, match="logits are not finite"):
        generate(model, [1, 2, 3], 8, 4, 0.9)


def test_a_missing_checkpoint(tmp_path, capsys):
    from dllm_offload_sim.validate.e2e import main

    code, err = call(
        main, ["--checkpoint", str(tmp_path / "nope"), "--prompts", str(tmp_path / "p.jsonl")], capsys
    )
    assert code == 2 and "no such checkpoint directory" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--cache", "4", "--policies", "naive_lru,moe_infinity"],
            "does not run prefetching policies yet ('moe_infinity')",
        ),
        (["--cache", "4", "--policies", "belady"], "'belady' needs the future routing"),
        (["--cache", "4", "--policies", "mine"], "unknown policy 'mine'"),
        (["--cache", "9"], "cache=9 exceeds the 8 experts"),
        (["--cache", "-1"], "argument --cache: must be an integer >= 0"),
        (["--max-new-tokens", "0"], "argument --max-new-tokens: must be an integer >= 1"),
    ],
)
def test_e2e_refuses_before_decoding(tiny_ckpt, tmp_path, capsys, monkeypatch, argv, message):
    import dllm_offload_sim.validate.e2e as E

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "1 + 1 ="}\n')
    monkeypatch.setattr(E, "run_e2e", lambda *a, **k: pytest.fail("decoding started before the checks"))
    code, err = call(
        E.main,
        [
            "--checkpoint",
            str(tiny_ckpt),
            "--prompts",
            str(prompts),
            "--device",
            "cpu",
            "--out",
            str(tmp_path / "o"),
            *argv,
        ],
        capsys,
    )
    assert code == 2 and message in err and not (tmp_path / "o").exists()


# ---- the validator's offline commands ------------------------------------------------------------------------
def test_report_and_repredict_of_missing_inputs(tmp_path, capsys):
    from dllm_offload_sim.validate.report import main as report
    from dllm_offload_sim.validate.repredict import main as repredict

    code, err = call(report, [str(tmp_path / "nope")], capsys)
    assert code == 2 and "nope" in err
    code, err = call(repredict, [str(tmp_path / "nope"), "--profile", "h200-mini"], capsys)
    assert code == 2 and "nope" in err
