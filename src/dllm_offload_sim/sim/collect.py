"""``dllm-sim-collect SWEEP_DIR``: merge a Hydra multirun into one Parquet table.

Every job directory with a ``done.json`` contributes its ``summary.parquet`` rows, with the job's
overrides as columns (``override.cache``, ``override.hw.pcie_gbps``, ...) and its directory as
``job_dir``. Jobs without ``done.json`` (still running, crashed or interrupted) are listed as
incomplete and left out, so a partial sweep is never mistaken for a complete one; the exit status is
1 when any job is incomplete, stale (its ``done.json`` holds another config's results, or another simulator
model's) or never started (``multirun.yaml`` says how many jobs the sweep launched); ``--allow-incomplete`` makes
it 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

from dllm_offload_sim.traces.atomic import atomic_write_parquet, parquet_has_columns
from dllm_offload_sim.traces.cli import HelpFormatter, entry_point
from dllm_offload_sim.traces.errors import TraceError


def job_dirs(sweep: Path) -> list[Path]:
    """Job directories of a multirun: those holding a ``.hydra`` folder."""
    return sorted({p.parent.parent for p in sweep.glob("**/.hydra/config.yaml")})


def _multirun(sweep: Path):
    """The sweep's ``multirun.yaml`` (the latest launch's config), None where it is missing."""
    from omegaconf import OmegaConf

    f = sweep / "multirun.yaml"
    if not f.is_file():
        return None
    try:
        return OmegaConf.load(f)
    except Exception as e:  # a damaged file: say which, and how to go on
        raise TraceError(
            f"{f}: unreadable ({str(e).splitlines()[0]}); it records what the sweep launched: run the "
            f"sweep again into the same directory to rewrite it (finished jobs are kept)"
        ) from None


def expected_jobs(sweep: Path) -> int | None:
    """How many jobs the sweep launched, from its ``multirun.yaml``; None where that file is missing."""
    cfg = _multirun(sweep)
    return None if cfg is None else sweep_size(cfg)


def launched_values(cfg) -> dict:
    """key -> the values the latest launch gave it (every value of a sweep), from a ``multirun.yaml``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    params = OmegaConf.select(cfg, "hydra.sweeper.params") or {}
    task = [str(t) for t in (OmegaConf.select(cfg, "hydra.overrides.task") or [])]
    out = {}
    parser = OverridesParser.create()
    for o in parser.parse_overrides([f"{k}={v}" for k, v in params.items()]) + parser.parse_overrides(task):
        vals = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
        out[o.get_key_element().lstrip("+~")] = set(vals)
    return out


def from_another_launch(job_overrides: list, launched: dict) -> str | None:
    """The first override of a job (``key=value`` strings) that the latest launch did not give, None if all fit."""
    for o in job_overrides:
        k, _, v = str(o).partition("=")
        k = k.lstrip("+~")
        if k in launched and v not in launched[k]:
            return f"{k}={v}"
    return None


def sweep_size(cfg) -> int:
    """How many jobs a multirun config launches (``hydra.sweeper.params`` and the sweep overrides of
    ``hydra.overrides.task``, combined as Hydra's basic sweeper does)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    params = OmegaConf.select(cfg, "hydra.sweeper.params") or {}
    task = [str(t) for t in (OmegaConf.select(cfg, "hydra.overrides.task") or [])]
    values = {}
    parser = OverridesParser.create()
    for o in parser.parse_overrides([f"{k}={v}" for k, v in params.items()]) + parser.parse_overrides(task):
        values[o.get_key_element()] = len(list(o.sweep_string_iterator())) if o.is_sweep_override() else 1
    n = 1
    for v in values.values():
        n *= v
    return n


# overrides that change how a job runs or reports, not what it computes: no column of the table
NOT_SETTINGS = ("quiet", "overwrite")


def typed_overrides(table: pd.DataFrame) -> pd.DataFrame:
    """The ``override.*`` columns as the values they set: a column whose every value reads as a number becomes
    numeric, one of ``true``/``false`` boolean; the rest stay text (Hydra's override strings)."""
    out = table.copy()
    for c in (c for c in out.columns if c.startswith("override.")):
        col = out[c]
        given = col.notna()
        low = col.astype(str).str.lower()
        if given.any() and low[given].isin(["true", "false"]).all():
            out[c] = low.eq("true").where(given)
            continue
        num = pd.to_numeric(col, errors="coerce")
        if given.any() and num[given].notna().all():
            out[c] = num
    return out


def sweep_speedups(table: pd.DataFrame) -> pd.DataFrame:
    """``speedup_vs_baseline`` across the whole sweep: each row's TPOT against the baseline policy's (the
    ``baseline`` column, ``table.baseline`` of its job) at the same cache and the same other overrides, wherever
    that baseline ran, in this job or another. Rows whose baseline did not run keep NaN."""
    if table.empty or "baseline" not in table:
        return table
    keys = ["cache"] + sorted(
        c for c in table.columns if c.startswith("override.") and c != "override.policy"
    )
    label = table["override.policy"].fillna(table.policy) if "override.policy" in table else table.policy
    t = table.assign(_label=label)
    base = t[t._label == t.baseline].drop_duplicates(keys + ["baseline"])[keys + ["baseline", "tpot_ms"]]
    merged = t.merge(base.rename(columns={"tpot_ms": "_base_tpot"}), on=keys + ["baseline"], how="left")
    out = table.copy()
    out["speedup_vs_baseline"] = (merged["_base_tpot"] / merged["tpot_ms"]).to_numpy()
    return out


def _job_number(d: Path) -> int | None:
    head = d.name.split("_", 1)[0]
    return int(head) if head.isdigit() else None


@dataclass
class SweepResults:
    """What a sweep directory holds: the rows of its complete jobs and what keeps the sweep from being whole."""

    table: pd.DataFrame
    incomplete: list  # job directories without a done.json (running, crashed or interrupted)
    stale: list  # job directories whose done.json belongs to another config than the job's own
    missing: list  # job numbers the sweep launched that left no directory (never started)
    expected: int | None  # jobs the sweep launched (multirun.yaml), None where unknown
    # (job directory, override) of jobs an earlier launch into the directory made, left out
    foreign: list = None

    @property
    def complete(self) -> bool:
        return not (self.incomplete or self.stale or self.missing or self.foreign)


def collect(sweep) -> SweepResults:
    """Every complete job's summary rows, and the jobs that keep the sweep from being whole."""
    from dllm_offload_sim.sim.app import job_config_sha, read_done
    from dllm_offload_sim.sim.engine import MODEL_VERSION

    sweep = Path(sweep)
    if not sweep.is_dir():
        raise FileNotFoundError(f"{sweep}: no such sweep directory")
    frames, incomplete, stale, foreign = [], [], [], []
    seen_overrides: dict = {}
    # a job's folder is its number; where an older naming (NUM_OVERRIDES) left folders too, today's come first
    dirs = sorted(job_dirs(sweep), key=lambda d: (not d.name.isdigit(), str(d)))
    mr = _multirun(sweep)
    launched = launched_values(mr) if mr is not None else None
    for d in dirs:
        if not (d / "done.json").is_file() or not (d / "summary.parquet").is_file():
            incomplete.append(d)
            continue
        done = read_done(d / "done.json")
        recorded = done.get("job_config_sha256")
        if (recorded is not None and recorded != job_config_sha(d)) or done.get(
            "model_version"
        ) != MODEL_VERSION:
            stale.append(d)  # another config's results, or another version of the simulator's model
            continue
        ov = yaml.safe_load((d / ".hydra" / "overrides.yaml").read_text()) or []
        key = tuple(sorted(str(o) for o in ov))
        if (
            key in seen_overrides
        ):  # the same job twice (a folder of an older naming beside today's): counted once
            foreign.append((d, f"the same job as {seen_overrides[key].name}"))
            continue
        seen_overrides[key] = d
        odd = from_another_launch(ov, launched) if launched is not None else None
        if odd is not None:  # a job of an earlier launch into the same directory, with other settings
            foreign.append((d, odd))
            continue
        t = pd.read_parquet(d / "summary.parquet")
        for o in ov:
            k, _, v = str(o).partition("=")
            if k.lstrip("+~") not in NOT_SETTINGS:
                t[f"override.{k.lstrip('+~')}"] = v
        t["job_dir"] = str(d.relative_to(sweep))
        frames.append(t)
    table = (
        sweep_speedups(typed_overrides(pd.concat(frames, ignore_index=True))) if frames else pd.DataFrame()
    )
    expected = expected_jobs(sweep)
    seen = {_job_number(d) for d in dirs}
    missing = [] if expected is None else [i for i in range(expected) if i not in seen]
    return SweepResults(table, incomplete, stale, missing, expected, foreign)


def summary_text(table: pd.DataFrame, limit: int = 40) -> str:
    """The merged table as printed: the overrides that vary across the sweep, then policy, cache, TPOT and the
    speedup against the baseline where it ran (the first ``limit`` rows)."""
    varying = [
        c
        for c in table.columns
        if c.startswith("override.")
        and c not in ("override.policy", "override.cache")  # (shown as the rows' own columns)
        and table[c].nunique(dropna=False) > 1
    ]
    cols = [c for c in (*varying, "policy", "cache", "tpot_ms", "speedup_vs_baseline") if c in table]
    t = table[cols].rename(columns=lambda c: c.removeprefix("override."))
    text = t.head(limit).to_string(index=False, float_format=lambda x: f"{x:.3f}")
    return text + (f"\n... and {len(t) - limit} more rows" if len(t) > limit else "")


def is_collected_table(path: Path) -> bool:
    """Whether ``path`` is a Parquet table this command wrote (one row per job and run, with ``job_dir``)."""
    return parquet_has_columns(path, ("job_dir", "policy", "cache", "tpot_ms"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="dllm-sim-collect",
        description=__doc__,
        formatter_class=HelpFormatter,
        epilog="Example: dllm-sim-collect multirun/pcie --out sweep.parquet",
    )
    p.add_argument("sweep", help="a multirun directory (hydra.sweep.dir)")
    p.add_argument("--out", default=None, help="output Parquet file (default: SWEEP/all.parquet)")
    p.add_argument("--allow-incomplete", action="store_true", help="exit 0 even if some jobs are incomplete")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --out file that is not a table "
        "this command wrote (one it wrote is replaced without it)",
    )
    args = p.parse_args(argv)
    out = Path(args.out) if args.out else Path(args.sweep) / "all.parquet"
    if out.exists() and not args.overwrite and not is_collected_table(out):
        raise TraceError(
            f"{out}: exists and is not a table dllm-sim-collect wrote; nothing was written (name another "
            f"--out, or pass --overwrite to replace it)"
        )
    r = collect(args.sweep)
    if len(r.table):
        atomic_write_parquet(out, r.table)
        print(summary_text(r.table))
        of = f" of {r.expected} launched" if r.expected is not None else ""
        print(f"wrote {out}: {len(r.table)} rows from {r.table.job_dir.nunique()} complete jobs{of}")
    else:
        print("no complete jobs found", file=sys.stderr)
    for d in r.incomplete:
        f = d / "failed.json"
        why = ""
        if f.is_file():
            try:
                why = f": failed: {json.loads(f.read_text()).get('error')}"
            except (OSError, ValueError):
                why = ": failed"
        print(f"incomplete (no done.json){why}: {d}", file=sys.stderr)
    for d in r.stale:
        print(
            f"stale (its done.json is another config's results, or the simulator's model changed since; rerun the "
            f"sweep into a new directory, or with overwrite=true): {d}",
            file=sys.stderr,
        )
    if r.missing:
        print(f"never started: jobs {r.missing} of the {r.expected} the sweep launched", file=sys.stderr)
    for d, odd in r.foreign or ():
        why = odd if odd.startswith("the same job") else f"{odd} is not what the latest launch swept"
        print(f"left out, from an earlier launch into this directory ({why}): {d}", file=sys.stderr)
    return 1 if not r.complete and not args.allow_incomplete else (0 if len(r.table) else 1)


cli = entry_point(main)  # console entry point ``dllm-sim-collect``


if __name__ == "__main__":
    cli()
