"""``dllm-fidelity-figure FIDELITY [...]``: the fidelity figure, predicted vs measured.

One point per validated run (policy x cache) for TPOT and TTFT (prefill), log-log, with the y = x
line and +-5% / +-10% error bands, from one or more ``fidelity.parquet`` / ``fidelity.csv`` tables written by
``dllm-validate``; a run replayed more than once (``validate.repeats``) carries its measured range
as a horizontal bar. Writes PNG + PDF and prints the median and maximum absolute TPOT error. For each run
directory whose runs kept their timed repeats, also ``<out>_cpu_drift`` (``<out>_cpu_drift_<directory>`` for
several): each repeat's CPU path over its prediction against the minutes into the sweep (``validate.sweep_drift``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from dllm_offload_sim.validate.error_stats import error_stats
from dllm_offload_sim.traces.cli import HelpFormatter, entry_point
from dllm_offload_sim.traces.atomic import atomic_savefig_png_pdf

METRICS = {"tpot_ms": "TPOT (ms)", "prefill_ms": "TTFT / prefill (ms)"}
BANDS = (0.05, 0.10)  # relative error bands drawn around y = x
MARKERS = "o^sD"  # one per model shape in the tables


LABEL_BEYOND = 0.05  # runs whose |error| exceeds this are named beside their points,
LABELS_AT_MOST = 3  # the largest few of them per panel


def _read_sweep_dir(d: Path) -> pd.DataFrame:
    """A validation run directory: its complete ``fidelity.parquet``, or else its finished runs (partial sweep);
    the finished runs also where they cover more runs than the table (the directory was validated into
    more than once, e.g. one cache per invocation: the table holds only the last invocation's runs)."""
    from dllm_offload_sim.validate.run_store import RunStore

    t = RunStore(d).finished_rows()
    if (d / "fidelity.parquet").is_file():
        table = pd.read_parquet(d / "fidelity.parquet")
        runs = lambda x: set(zip(x.policy, x.cache))  # noqa: E731
        if t is not None and runs(t) > runs(table):
            print(
                f"note: {d}/fidelity.parquet holds its last invocation's {len(runs(table))} runs; using all "
                f"{len(runs(t))} finished runs under runs/",
                file=sys.stderr,
            )
            return t
        return table
    if t is None:
        raise FileNotFoundError(f"{d}: neither fidelity.parquet nor finished runs under runs/")
    n = t.groupby(["policy", "cache"]).ngroups
    print(f"note: {d} is a partial sweep (no fidelity.parquet); using its {n} finished runs", file=sys.stderr)
    return t


def load_tables(paths) -> pd.DataFrame:
    """Concatenate fidelity tables (files, or run directories of ``dllm-validate``); a missing file or
    a table without the fidelity columns is an error."""
    need = {"policy", "cache", "metric", "predicted", "measured"}
    frames = []
    for p in map(Path, paths):
        if p.is_dir():
            t = _read_sweep_dir(p)
        elif not p.is_file():
            raise FileNotFoundError(f"{p}: no such fidelity table")
        else:
            t = pd.read_parquet(p) if p.suffix == ".parquet" else pd.read_csv(p)
        missing = need - set(t.columns)
        if missing:
            raise ValueError(f"{p}: not a fidelity table (missing columns {sorted(missing)})")
        frames.append(t)
    return pd.concat(frames, ignore_index=True)


TABLES_HELP = (
    "fidelity.parquet / fidelity.csv files or validate run directories (a partial sweep's finished runs)"
)


def load_tables_cli(paths) -> pd.DataFrame | None:
    """:func:`load_tables` for the command lines: None after printing the error."""
    try:
        return load_tables(paths)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return None


def plot_fidelity(table: pd.DataFrame, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mets = [m for m in METRICS if (table.metric == m).any()]
    fig, axes = plt.subplots(1, len(mets), figsize=(5 * len(mets), 4.6), squeeze=False)
    for ax, m in zip(axes[0], mets):
        t = table[table.metric == m]
        hi = 1.3 * max(t.predicted.max(), t.measured.max())
        lo = 0.7 * min(t.predicted.min(), t.measured.min())
        xs = [lo, hi]
        ax.plot(xs, xs, "k-", lw=1, label="y = x")
        for b, a in zip(BANDS, (0.18, 0.09)):
            ax.fill_between(
                xs,
                [lo * (1 - b), hi * (1 - b)],
                [lo * (1 + b), hi * (1 + b)],
                color="tab:green",
                alpha=a,
                lw=0,
                label=f"±{b:.0%}",
            )
        models = list(dict.fromkeys(t["model"])) if "model" in t else [None]
        cmap = plt.get_cmap("tab20")  # 13 policies: distinct colours
        colors = {pol: cmap(i % 20) for i, pol in enumerate(dict.fromkeys(table.policy))}
        for pol, g0 in t.groupby("policy", sort=False):
            for mi, model in enumerate(models):  # one marker per model shape, one colour per policy
                g = g0 if model is None else g0[g0.model == model]
                if g.empty:
                    continue
                lab = pol if len(models) == 1 else f"{pol} ({str(model).removeprefix('llada2-')})"
                ax.scatter(
                    g.measured,
                    g.predicted,
                    s=28,
                    label=lab,
                    zorder=3,
                    color=colors[pol],
                    marker=MARKERS[mi % len(MARKERS)],
                )
                rep = g[g.measured_min.notna()] if "measured_min" in g else g.iloc[:0]
                if len(rep):  # runs replayed more than once: the measured range as a horizontal bar
                    ax.errorbar(
                        rep.measured,
                        rep.predicted,
                        xerr=[rep.measured - rep.measured_min, rep.measured_max - rep.measured],
                        fmt="none",
                        ecolor=colors[pol],
                        elinewidth=1,
                        capsize=2,
                        zorder=2,
                    )
        # the largest errors beyond the 5% band are named (policy and cache): labels on every point overlap
        err = (t.predicted / t.measured - 1).abs()
        for _, r in t[err > LABEL_BEYOND].assign(_err=err).nlargest(LABELS_AT_MOST, "_err").iterrows():
            ax.annotate(
                f"{r['policy']}, Cache {r['cache']}",
                (r.measured, r.predicted),
                fontsize=6,
                xytext=(4, -8),
                textcoords="offset points",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"measured {METRICS[m]}")
        ax.set_ylabel(f"simulated {METRICS[m]}")
        s = error_stats(table, m)
        ax.set_title(f"{METRICS[m]}: median |err| {s['median']:.1%}, max {s['max']:.1%}", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=6, loc="upper left", ncol=2)
    fig.tight_layout()
    paths = atomic_savefig_png_pdf(fig, out)
    plt.close(fig)
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="dllm-fidelity-figure",
        description=__doc__,
        formatter_class=HelpFormatter,
        epilog="Example: dllm-fidelity-figure validation/h100/mini validation/h100/flash --out /tmp/fidelity",
    )
    p.add_argument("tables", nargs="+", help=TABLES_HELP)
    p.add_argument("--out", default="fidelity", help="output path without suffix (PNG and PDF are written)")
    a = p.parse_args(argv)
    table = load_tables_cli(a.tables)
    if table is None:
        return 2
    for f in plot_fidelity(table, Path(a.out)):
        print(f"wrote {f}")
    from dllm_offload_sim.validate.sweep_drift import plot_drift, repeat_drift

    dirs = [Path(t) for t in a.tables if (Path(t) / "runs").is_dir()]
    for d in dirs:
        drift = repeat_drift(d)
        if (drift.finished_unix_s.notna() & drift.cpu_path_ratio.notna()).any():
            name = f"{Path(a.out).name}_cpu_drift" + (f"_{d.name}" if len(dirs) > 1 else "")
            for f in plot_drift(drift, Path(a.out).with_name(name)):
                print(f"wrote {f}")
    s = error_stats(table)
    print(f"TPOT: {s['runs']} runs, median |error| {s['median']:.1%}, max {s['max']:.1%}")
    return 0


cli = entry_point(main)  # console entry point ``dllm-fidelity-figure``


if __name__ == "__main__":
    cli()
