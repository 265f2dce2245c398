"""``dllm-stats [TRACE_DIR]``: print and plot a trace's workload characterisation.

Prints a summary (adjacent-iteration and block-boundary overlap, distinct experts per layer per
forward, footprint and FLOPs ratio vs one token, tokens per forward, confidence vs stability) and the
tables behind the paper's Fig. 4, 7 and 10, and the route kept per layer of decoded and still-masked tokens
(``stability_layers.csv``); writes them as CSV plus PNG plots into ``--out``.
With no TRACE_DIR it analyses the trace shipped with the package; a shipped trace can be named
(``synthetic_mini_b16``). ``--compare OTHER ...`` adds a side-by-side summary of other traces
(e.g. your collected trace against the shipped real and synthetic ones) and writes ``compare.csv``, with each
trace's distance from LLaDA2.0's behaviour (``traces.likeness``: tokens per forward, block-boundary overlap,
confident tokens keeping their routes) and which trace is closer on each.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dllm_offload_sim.traces.analytics import KEPT_GROUPS, TraceStats, compute_stats
from dllm_offload_sim.traces.errors import TraceError
from dllm_offload_sim.traces.likeness import BehaviourGaps, format_gaps
from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.traces.shipped import resolve_trace
from dllm_offload_sim.traces.cli import entry_point, positive_int
from dllm_offload_sim.traces.atomic import atomic_savefig

PAPER = {  # what the OLED-MoE paper measured on LLaDA2.0 (§3.1, §3.3)
    "adjacent_overlap": "0.85-0.90",
    "boundary_overlap": "> 0.65",
    "distinct_experts_per_layer": "~60 (mini, block 16)",
    "footprint_ratio_vs_token": "~8x",
    "flops_ratio_vs_token": "~16x",
    "tokens_per_forward": "2.55 (dInfer, mini)",
    "stability_conf_0.9_up": "above the < 0.5 rate (Fig. 10a)",
}


def format_summary(stats: TraceStats) -> str:
    lines = [f"{'metric':34s} {'this trace':>14s}   paper"]
    for k, v in stats.summary.items():
        val = f"{v:14.3f}" if isinstance(v, float) else f"{v!s:>14s}"
        lines.append(f"{k:34s} {val}   {PAPER.get(k, '')}")
    return "\n".join(lines)


def format_comparison(names: list[str], summaries: list[dict]) -> str:
    """Summary metrics of several traces side by side, with the paper's values."""
    keys = [k for k, v in summaries[0].items() if isinstance(v, (int, float))]
    w = max(14, *(len(n) for n in names))
    lines = [f"{'metric':34s} " + " ".join(f"{n:>{w}s}" for n in names) + "   paper"]
    for k in keys:
        vals = " ".join(
            f"{s.get(k, float('nan')):>{w}.3f}" if isinstance(s.get(k), float) else f"{s.get(k)!s:>{w}s}"
            for s in summaries
        )
        lines.append(f"{k:34s} {vals}   {PAPER.get(k, '')}")
    return "\n".join(lines)


def plot_stats(stats: TraceStats, out: Path, title: str) -> list[Path]:
    """Write the Fig. 4 / 7 / 10 style PNGs; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    # Fig. 7: overlap vs iteration gap
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for kind, style in (("within_block", "o-"), ("boundary", "s--")):
        d = stats.overlap[stats.overlap.kind == kind]
        if len(d):
            ax.plot(d.gap, 100 * d.overlap, style, label=kind.replace("_", " "))
    ax.axhspan(85, 90, color="tab:green", alpha=0.15, label="paper: adjacent 85-90%")
    ax.axhline(65, color="tab:red", lw=0.8, ls=":", label="paper: boundary > 65%")
    ax.set_xlabel("iteration gap (forwards)")
    ax.set_ylabel("same-layer expert overlap (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"Routing overlap vs gap — {title}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / "fig7_overlap_vs_gap.png")
    atomic_savefig(fig, paths[-1], dpi=130)
    plt.close(fig)

    # Fig. 4: footprint and FLOPs, block vs single token
    s = stats.summary
    fig, axes = plt.subplots(1, 2, figsize=(6.5, 3.2))
    axes[0].bar(
        ["1 token (AR)", f"block {s['block_length']}"],
        [s["distinct_experts_single_token"], s["distinct_experts_per_layer"]],
        color=["grey", "tab:blue"],
    )
    axes[0].set_ylabel("distinct experts / MoE layer / forward")
    axes[1].bar(
        ["1 token (AR)", f"block {s['block_length']}"],
        [s["expert_gflops_per_layer_token"], s["expert_gflops_per_layer_block"]],
        color=["grey", "tab:orange"],
    )
    axes[1].set_ylabel("expert GFLOPs / MoE layer / forward")
    fig.suptitle(f"Expert footprint and FLOPs — {title}", fontsize=9)
    fig.tight_layout()
    paths.append(out / "fig4_footprint_flops.png")
    atomic_savefig(fig, paths[-1], dpi=130)
    plt.close(fig)

    # Fig. 10: confidence vs stability, and per-layer activation ratio
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.3))
    c = stats.confidence
    mid = (c.bin_lo + c.bin_hi) / 2
    axes[0].bar(
        mid - 0.022, 100 * c.mean_stability, width=0.044, color="tab:purple", label="tokens still masked"
    )
    axes[0].bar(
        mid + 0.022,
        100 * c.mean_stability_with_decoded,
        width=0.044,
        color="tab:orange",
        label="all masked (decoded ones too)",
    )
    axes[0].legend(fontsize=6, loc="lower left")
    axes[0].set_xlabel("token confidence (bin)")
    axes[0].set_ylabel("experts kept next forward (%)")
    axes[0].set_title("(a) confidence vs routing stability", fontsize=9)
    if len(stats.conf_samples):
        axes[1].hist2d(
            stats.conf_samples[:, 0],
            100 * stats.conf_samples[:, 1],
            bins=[10, 9],
            range=[[0, 1], [0, 100]],
            cmap="Blues",
        )
    axes[1].set_xlabel("token confidence")
    axes[1].set_ylabel("route stability (%)")
    axes[1].set_title("(b) confidence-stability distribution", fontsize=9)
    axes[2].bar(stats.layers.layer.astype(str), 100 * stats.layers.activation_ratio, color="tab:green")
    axes[2].set_xlabel("MoE layer")
    axes[2].set_ylabel("activation ratio (%)")
    axes[2].tick_params(axis="x", labelsize=6)
    axes[2].set_title("(c) layer-wise activation ratio", fontsize=9)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    paths.append(out / "fig10_confidence_layers.png")
    atomic_savefig(fig, paths[-1], dpi=130)
    plt.close(fig)
    return paths


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dllm-stats",
        description="Workload characterisation of a trace (paper Fig. 4, 7, 10): tables on stdout, CSV + PNG in --out.",
        epilog="Example: dllm-stats traces_out/mini16 --out outputs/stats/mini16",
    )
    p.add_argument("trace", nargs="?", default=None, help="trace directory (default: the shipped trace)")
    p.add_argument("--out", default=None, help="output folder (default: outputs/trace_stats/<trace name>)")
    p.add_argument(
        "--requests", type=positive_int, default=None, help="analyse only the first N requests (N >= 1)"
    )
    p.add_argument(
        "--max-gap",
        type=positive_int,
        default=8,
        help="largest iteration gap for the overlap curve (default 8)",
    )
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
    p.add_argument(
        "--compare",
        nargs="+",
        default=[],
        metavar="OTHER",
        help="other traces (directories or shipped names) to put beside this one in a summary table",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    path = resolve_trace(args.trace)
    try:
        trace = Trace.open(path)
        ids = trace.request_ids[: args.requests] if args.requests else None
        stats = compute_stats(trace, ids, max_gap=args.max_gap, progress=not args.quiet)
        others = []
        for o in args.compare:
            ot = Trace.open(resolve_trace(o))
            oids = ot.request_ids[: args.requests] if args.requests else None
            others.append(
                (ot.path.name, compute_stats(ot, oids, max_gap=args.max_gap, progress=False).summary)
            )
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path("outputs") / "trace_stats" / path.name
    from dllm_offload_sim.traces.atomic import atomic_write_json, atomic_write_text, output_folder

    output_folder(out, "tables and plots")

    atomic_write_json(out / "summary.json", stats.summary)
    atomic_write_text(out / "overlap.csv", stats.overlap.to_csv(index=False))
    atomic_write_text(out / "layers.csv", stats.layers.to_csv(index=False))
    atomic_write_text(out / "confidence.csv", stats.confidence.to_csv(index=False))
    atomic_write_text(out / "stability_layers.csv", stats.stability_layers.to_csv(index=False))
    if args.json:
        print(json.dumps(stats.summary, indent=2))
    else:
        print(f"trace: {path}  ({trace.topology.name}, {len(trace)} requests, {trace.source})\n")
        print(format_summary(stats))
        print("\nOverlap vs iteration gap (Fig. 7):")
        print(stats.overlap.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        print("\nPer-layer footprint (Fig. 4a, 10c):")
        print(stats.layers.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        print("\nConfidence vs routing stability (Fig. 10a):")
        print(stats.confidence.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        print(
            "\nRoute kept to the next forward, per layer, of masked tokens ("
            + "; ".join(f"{k}: {v}" for k, v in KEPT_GROUPS.items())
            + "):"
        )
        print(stats.stability_layers.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    if others:
        import pandas as pd

        names, sums = [path.name] + [n for n, _ in others], [stats.summary] + [s for _, s in others]
        rows = [
            {**s, **{f"llada2_gap_{k}": v for k, v in BehaviourGaps.of(s).as_dict().items()}} for s in sums
        ]
        atomic_write_text(out / "compare.csv", pd.DataFrame(rows, index=names).T.to_csv(index_label="metric"))
        print("\nCompared with other traces:", file=sys.stderr if args.json else sys.stdout)
        print(format_comparison(names, sums), file=sys.stderr if args.json else sys.stdout)
        print("\n" + format_gaps(names, sums), file=sys.stderr if args.json else sys.stdout)
    if not args.no_plots:
        for p in plot_stats(stats, out, f"{trace.topology.name}, {path.name}"):
            print(f"wrote {p}", file=sys.stderr if args.json else sys.stdout)
    print(f"tables in {out}", file=sys.stderr if args.json else sys.stdout)
    return 0


cli = entry_point(main)  # console entry point ``dllm-stats``


if __name__ == "__main__":
    cli()
