"""``python -m sim.collect SWEEP_DIR``: merge a Hydra multirun into one Parquet table.

Every job directory with a ``done.json`` contributes its ``summary.parquet`` rows, with the job's
overrides as columns (``override.cache``, ``override.hw.pcie_gbps``, ...) and its directory as
``job_dir``. Jobs without ``done.json`` (still running, crashed or interrupted) are listed as
incomplete and left out, so a partial sweep is never mistaken for a complete one; the exit status is
1 when any job is incomplete (``--allow-incomplete`` makes it 0).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import yaml

from traces.atomic import atomic_write_parquet


def job_dirs(sweep: Path) -> list[Path]:
    """Job directories of a multirun: those holding a ``.hydra`` folder."""
    return sorted({p.parent.parent for p in sweep.glob("**/.hydra/config.yaml")})


def collect(sweep) -> tuple[pd.DataFrame, list[Path]]:
    """(rows of every complete job, incomplete job directories)."""
    sweep = Path(sweep)
    if not sweep.is_dir():
        raise FileNotFoundError(f"{sweep}: no such sweep directory")
    frames, incomplete = [], []
    for d in job_dirs(sweep):
        if not (d / "done.json").is_file() or not (d / "summary.parquet").is_file():
            incomplete.append(d)
            continue
        t = pd.read_parquet(d / "summary.parquet")
        ov = yaml.safe_load((d / ".hydra" / "overrides.yaml").read_text()) or []
        for o in ov:
            k, _, v = str(o).partition("=")
            t[f"override.{k.lstrip('+~')}"] = v
        t["job_dir"] = str(d.relative_to(sweep))
        frames.append(t)
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return table, incomplete


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sim.collect", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Example: python -m sim.collect multirun/pcie --out sweep.parquet")
    p.add_argument("sweep", help="a multirun directory (hydra.sweep.dir)")
    p.add_argument("--out", default=None, help="output Parquet file (default: SWEEP/all.parquet)")
    p.add_argument("--allow-incomplete", action="store_true", help="exit 0 even if some jobs are incomplete")
    args = p.parse_args(argv)
    try:
        table, incomplete = collect(args.sweep)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path(args.sweep) / "all.parquet"
    if len(table):
        atomic_write_parquet(out, table)
        print(f"wrote {out}: {len(table)} rows from {table.job_dir.nunique()} complete jobs")
    else:
        print("no complete jobs found", file=sys.stderr)
    for d in incomplete:
        print(f"incomplete (no done.json): {d}", file=sys.stderr)
    return 1 if incomplete and not args.allow_incomplete else (0 if len(table) else 1)


if __name__ == "__main__":
    sys.exit(main())
