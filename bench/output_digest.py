"""Digests of a run's tables with the wall-clock columns left out: the check that a refactor changed no result.

    python bench/output_digest.py RUN_DIR [MORE ...] [--out digests.txt]
    python bench/output_digest.py --compare before.txt after.txt

Each ``.parquet`` and ``.csv`` file under the given folders (a ``dllm-sim`` run, a sweep, ``figures/``) is read with
pandas; the columns that time this machine (``*_wall_s``, ``sim_layer_execs_per_s``, ``policy_ms_per_forward``,
``policy_us_per_layer``, ``policy_hooks_us_per_forward``, ``overhead_pct_of_forward``) are dropped, and the rest is
hashed as CSV with full float precision. The same simulation gives the same digest; ``--compare`` lists the files
whose digest differs or is missing on one side, and exits 1 if any does.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from pathlib import Path

import pandas as pd

WALL_CLOCK = re.compile(
    r"(_wall_s$|^sim_layer_execs_per_s$|^policy_ms_per_forward$|^policy_us_per_layer$|"
    r"^policy_hooks_us_per_forward$|^overhead_pct_of_forward$)"
)


def table_digest(path: Path) -> str:
    """sha256 of the table at ``path`` without its wall-clock columns, as CSV with floats written exactly."""
    df = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    df = df[[c for c in df.columns if not WALL_CLOCK.search(str(c))]]
    return hashlib.sha256(df.to_csv(index=False, float_format="%.17g").encode()).hexdigest()


def digests(folders: list[Path]) -> dict[str, str]:
    out = {}
    for folder in folders:
        for p in sorted(folder.rglob("*")):
            if p.suffix in (".parquet", ".csv") and "_work" not in p.parts and ".hydra" not in p.parts:
                out[str(p.relative_to(folder.parent))] = table_digest(p)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="*", type=Path)
    ap.add_argument("--out", type=Path, help="write 'digest  file' lines here as well")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args(argv)
    if args.compare:
        a, b = (
            {ln.split()[1]: ln.split()[0] for ln in f.read_text().splitlines() if ln.strip()}
            for f in args.compare
        )
        bad = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        for k in bad:
            print(f"differs: {k} ({a.get(k, 'missing')[:12]} -> {b.get(k, 'missing')[:12]})")
        print(f"{len(a.keys() | b.keys()) - len(bad)} tables identical, {len(bad)} differ")
        return 1 if bad else 0
    lines = [f"{d}  {k}" for k, d in digests(args.folders).items()]
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
