"""``dllm-sim-plot SWEEP --x COLUMN --y COLUMN [--hue COLUMN] [--col COLUMN]``: plot a sweep.

Reads a sweep directory (its complete jobs, as ``dllm-sim-collect`` merges them) or a table
(``all.parquet``, ``summary.parquet``, a CSV), and draws ``--y`` against ``--x``, one line per ``--hue``
value and one panel per ``--col`` value, sorted along x, as PNG and PDF. A column may be named as in the
table or by its override (``hw.pcie_gbps`` reads ``pcie_gbps``, or ``override.hw.pcie_gbps`` where only
that holds it). Units come from docs/outputs.md.

Example::

    dllm-sim -m policy=oled,naive_lru cache=40,100 hw.pcie_gbps=16,32,64,128 hydra.sweep.dir=sweeps/pcie
    dllm-sim-plot sweeps/pcie --x hw.pcie_gbps --y tpot_ms --hue policy --col cache --out pcie
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from dllm_offload_sim.traces.atomic import atomic_savefig_png_pdf
from dllm_offload_sim.traces.cli import HelpFormatter, entry_point

LABELS = {
    "tpot_ms": "TPOT (ms)",
    "ttft_ms": "TTFT (ms)",
    "pcie_gbps": "PCIe bandwidth (GB/s)",
    "cache": "Cache (slots per MoE layer)",
    "hit_rate": "hit rate",
    "cache_util": "cache utilisation",
    "h2d_gb": "H2D copied (GB)",
    "cpu_experts": "experts run on the CPU",
    "batch_size": "batch size",
    "speedup_vs_baseline": "speedup vs baseline",
}


def load_table(source) -> pd.DataFrame:
    """A sweep directory's complete rows, or a table file."""
    source = Path(source)
    if source.is_dir():
        from dllm_offload_sim.sim.collect import collect

        r = collect(source)
        if r.table.empty:
            raise ValueError(f"{source}: no complete jobs to plot")
        return r.table
    if not source.is_file():
        raise FileNotFoundError(f"{source}: no such sweep directory or table")
    return pd.read_csv(source) if source.suffix == ".csv" else pd.read_parquet(source)


def column(table: pd.DataFrame, name: str | None) -> str | None:
    """The table's column for ``name`` (as given, its last dotted part, or ``override.NAME``)."""
    if name is None:
        return None
    for c in (name, name.rsplit(".", 1)[-1], f"override.{name}"):
        if c in table.columns:
            return c
    raise ValueError(f"no column {name!r} in the table; it has {', '.join(sorted(table.columns))}")


def value_order(v) -> tuple:
    """Sort key for panel and line values: numbers by value (an override column holds "40", "100" as text), then
    the rest as text."""
    try:
        return (0, float(v), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(v))


def plot(table: pd.DataFrame, x: str, y: str, hue: str | None = None, col: str | None = None):
    """The figure: one panel per ``col`` value, one line per ``hue`` value, points sorted along ``x``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xc, yc, hc, cc = column(table, x), column(table, y), column(table, hue), column(table, col)
    t = table.copy()
    for c in (xc, yc):
        t[c] = pd.to_numeric(t[c], errors="raise")
    panels = sorted(t[cc].unique(), key=value_order) if cc else [None]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2), squeeze=False, sharey=True)
    for ax, pv in zip(axes[0], panels):
        sub = t if cc is None else t[t[cc] == pv]
        lines = (
            [(hv, sub[sub[hc] == hv]) for hv in sorted(sub[hc].unique(), key=value_order)]
            if hc
            else [(None, sub)]
        )
        for hv, g in lines:
            g = g.sort_values(xc)
            ax.plot(g[xc], g[yc], marker="o", label=str(hv) if hc else None)
        ax.set_xlabel(LABELS.get(xc.rsplit(".", 1)[-1], xc))
        if cc:
            ax.set_title(f"{LABELS.get(cc.rsplit('.', 1)[-1], cc)} = {pv}", fontsize=9)
        xs = sorted(sub[xc].unique())
        if (
            len(xs) > 2 and min(xs) > 0 and max(xs) / min(xs) >= 8
        ):  # bandwidth or cache sweeps: log x, real ticks
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [f"{v:g}" for v in xs])
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(LABELS.get(yc, yc))
    if hc:
        axes[0][-1].legend(title=hc.rsplit(".", 1)[-1], fontsize=8)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="dllm-sim-plot", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("source", help="a sweep directory (hydra.sweep.dir) or a table (.parquet, .csv)")
    p.add_argument("--x", required=True, help="column on the x axis, e.g. hw.pcie_gbps or cache")
    p.add_argument("--y", default="tpot_ms", help="column on the y axis (default tpot_ms)")
    p.add_argument(
        "--hue", default="policy", help="one line per value of this column (default policy; 'none' for one)"
    )
    p.add_argument("--col", default=None, help="one panel per value of this column, e.g. cache")
    p.add_argument("--out", default=None, help="output path without suffix (default: SOURCE/plot_<y>_vs_<x>)")
    a = p.parse_args(argv)
    table = load_table(a.source)
    fig = plot(table, a.x, a.y, None if a.hue == "none" else a.hue, a.col)
    src = Path(a.source)
    stem = (
        Path(a.out)
        if a.out
        else (src if src.is_dir() else src.parent) / f"plot_{a.y}_vs_{a.x.rsplit('.', 1)[-1]}"
    )
    for f in atomic_savefig_png_pdf(fig, stem):
        print(f"wrote {f}")
    return 0


cli = entry_point(main)  # console entry point ``dllm-sim-plot``


if __name__ == "__main__":
    cli()
