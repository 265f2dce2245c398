"""Nothing the user made is deleted or overwritten (the reliability audit's data-loss cases N-OUT09, N-OUT10, N-OUT19,
N-SW13, N-OUT20): each case as the audit ran it, and what is kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from dllm_offload_sim.traces.atomic import atomic_directory
from dllm_offload_sim.traces.cli import run_cli
from dllm_offload_sim.traces.errors import TraceError
from dllm_offload_sim.traces.synth import main as synth

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--n-requests", "1", "--max-new-tokens", "16", "--quiet"]


def test_n_out09_overwrite_keeps_a_trace_folder_that_holds_the_users_files(tmp_path, capsys):
    """N-OUT09: --overwrite on a trace folder with the user's NOTES.md and plots/ in it."""
    t = tmp_path / "t"
    assert run_cli(synth, [*SMALL, "--out", str(t)]) == 0
    (t / "NOTES.md").write_text("precious")
    (t / "plots").mkdir()
    (t / "plots" / "fig.png").write_text("png")
    before = (t / "meta.json").read_text()
    assert run_cli(synth, [*SMALL, "--seed", "3", "--out", str(t), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "NOTES.md" in err and "plots" in err and "nothing was written" in err
    assert (t / "NOTES.md").read_text() == "precious" and (t / "plots" / "fig.png").is_file()
    assert (t / "meta.json").read_text() == before


def test_n_out10_overwrite_keeps_a_folder_whose_meta_json_is_not_a_traces(tmp_path, capsys):
    """N-OUT10: --overwrite on a web project that happens to hold a meta.json; also with the meta.json alone."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "meta.json").write_text(json.dumps({"title": "my site"}))
    (site / "index.html").write_text("<html>")
    assert run_cli(synth, [*SMALL, "--out", str(site), "--overwrite"]) == 2
    assert (site / "index.html").is_file()
    (site / "index.html").unlink()
    assert run_cli(synth, [*SMALL, "--out", str(site), "--overwrite"]) == 2
    assert "not a trace's" in capsys.readouterr().err
    assert json.loads((site / "meta.json").read_text()) == {"title": "my site"}


def test_overwrite_still_replaces_a_trace_of_its_own(tmp_path):
    t = tmp_path / "t"
    assert run_cli(synth, [*SMALL, "--seed", "1", "--out", str(t)]) == 0
    assert run_cli(synth, [*SMALL, "--seed", "2", "--out", str(t), "--overwrite"]) == 0
    assert json.loads((t / "meta.json").read_text())["extra"]["generator"]["seed"] == 2


def test_n_out19_a_writer_does_not_replace_what_another_completed_meanwhile(tmp_path):
    """N-OUT19: the second of two writers into one folder, neither with overwrite, fails and keeps the first's."""
    final = tmp_path / "out"
    with pytest.raises(TraceError, match="another writer completed"):
        with atomic_directory(final) as tmp:
            (tmp / "meta.json").write_text("second")
            final.mkdir()  # the other writer finishes first
            (final / "meta.json").write_text("first")
    assert (final / "meta.json").read_text() == "first"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]  # nothing half-written left


def test_n_out19_two_synth_processes_into_one_folder(tmp_path):
    """N-OUT19 as the audit ran it: two dllm-synth at once; the folder holds one complete trace, and a writer that
    printed 'wrote' wrote it."""
    cmd = [
        sys.executable,
        "-m",
        "dllm_offload_sim.traces.synth",
        "--n-requests",
        "3",
        "--max-new-tokens",
        "64",
        "--quiet",
        "--out",
        str(tmp_path / "t"),
    ]
    procs = [
        subprocess.Popen([*cmd, "--seed", str(s)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for s in (1, 2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    rcs = [p.returncode for p in procs]
    assert sorted(rcs) == [0, 2], outs  # the later one fails: at its start, or at its end without replacing
    winner = rcs.index(0)
    assert "wrote" in outs[winner][0] and "wrote" not in outs[1 - winner][0]
    assert (
        json.loads((tmp_path / "t" / "meta.json").read_text())["extra"]["generator"]["seed"] == (1, 2)[winner]
    )


def _sweep(tmp_path) -> Path:
    t = tmp_path / "trace"
    assert run_cli(synth, [*SMALL, "--out", str(t)]) == 0
    sw = tmp_path / "sw"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "dllm_offload_sim.sim",
            "-m",
            "quiet=true",
            f"trace.path={t}",
            "policy=lru",
            "cache=20",
            f"hydra.sweep.dir={sw}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return sw


def test_n_sw13_collect_keeps_a_users_file_named_by_out(tmp_path, capsys):
    """N-SW13: dllm-sim-collect --out naming the user's text file; its own table it replaces."""
    from dllm_offload_sim.sim.collect import main as collect

    sw = _sweep(tmp_path)
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    assert run_cli(collect, [str(sw), "--out", str(notes)]) == 2
    assert notes.read_text() == "my notes" and "not a table dllm-sim-collect wrote" in capsys.readouterr().err
    assert (
        run_cli(collect, [str(sw)]) == 0 and run_cli(collect, [str(sw)]) == 0
    )  # its own all.parquet: replaced
    assert run_cli(collect, [str(sw), "--out", str(notes), "--overwrite"]) == 0


def test_n_out20_a_run_dir_holding_the_users_summary_is_refused(tmp_path):
    """N-OUT20: hydra.run.dir= a folder of the user's with a summary.parquet of other work."""
    t = tmp_path / "trace"
    assert run_cli(synth, [*SMALL, "--out", str(t)]) == 0
    res = tmp_path / "results"
    res.mkdir()
    pd.DataFrame({"experiment": ["mine"], "score": [0.93]}).to_parquet(res / "summary.parquet")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "dllm_offload_sim.sim",
            "quiet=true",
            "policy=lru",
            "cache=40",
            f"trace.path={t}",
            f"hydra.run.dir={res}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert p.returncode == 2 and "not a summary this simulator wrote" in p.stderr
    assert "experiment" in pd.read_parquet(res / "summary.parquet")


def test_n_out15_a_file_size_limit_names_the_file_and_leaves_nothing(tmp_path):
    """N-OUT15 (and O-TB04's kind: a write that fails names its file): dllm-synth under a 64-block file-size limit."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "dllm_offload_sim.traces.synth",
            "--quiet",
            "--n-requests",
            "2",
            "--max-new-tokens",
            "64",
            "--out",
            "t",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limit,
    )
    assert p.returncode == 2 and "t/routing.parquet: File too large" in p.stderr, p.stderr[-1000:]
    assert list(tmp_path.iterdir()) == []  # no trace, no partial


def test_o_tb04_a_full_disk_names_the_file_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    """O-TB04: dllm-synth into a full disk. The disk is made full where pyarrow writes (its errors carry the errno in
    their text and name no file), as a tmpfs of 1 MiB did in the audit."""
    import pyarrow.parquet as pq

    def full(self, table, *a, **k):
        raise OSError("IOError: [errno 28] No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full)
    assert run_cli(synth, [*SMALL, "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert (
        f"{tmp_path / 't' / 'steps.parquet'}: no space left on device; nothing half-written was kept" in err
    ), err
    assert list(tmp_path.iterdir()) == []  # no trace, no partial
