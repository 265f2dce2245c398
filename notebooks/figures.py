"""Regenerate the paper's figures from simulator sweeps: ``python notebooks/figures.py``.

One command: writes the synthetic traces the sweeps need, runs every ``conf/experiment/fig*.yaml``
as a Hydra multirun (joblib launcher; finished jobs are not recomputed on a rerun), collects each
sweep into a table, and draws every figure as PNG + PDF + the CSV behind it into ``--out``, with an
``index.md`` whose every caption names the traces and the profile the figure was simulated on. The paper's numeric
claims beside ours, explained factor by factor, are ``dllm-reproduce``'s (docs/reproduction.md).
``--quick`` runs a reduced set (mini only, short traces, fewer points) in well under a minute (26 s on the 2-core
development machine, docs/figures.md), for CI.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable as a script from a checkout
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from dllm_offload_sim.sim.collect import collect  # noqa: E402
from dllm_offload_sim.traces.analytics import compute_stats  # noqa: E402
from dllm_offload_sim.traces.atomic import atomic_savefig, atomic_write_text, output_folder  # noqa: E402
from dllm_offload_sim.traces.cli import HelpFormatter, positive_int, run_cli  # noqa: E402
from dllm_offload_sim.traces.reader import Trace  # noqa: E402
from dllm_offload_sim.traces.figure_traces import make_figure_traces  # noqa: E402

BASELINES = ["moe_infinity", "finemoe", "ktransformers"]  # the paper's three systems (§5.1)
LADDER = ["naive_lru", "oled_priority", "oled_priority_layeradapt", "oled"]
EXPERIMENTS = ["fig12", "fig13", "fig14", "fig15b", "fig15c", "fig16a", "fig16b", "fig17a", "fig17b"]

# reduced sweeps for --quick: Hydra sweeper overrides per experiment
QUICK = {  # command-line sweeps override the experiment's hydra.sweeper.params of the same key
    "fig12": [
        "model=mini",
        "cache=40",
        "policy=naive_lru,moe_infinity,finemoe,ktransformers,oled_priority,"
        "oled_priority_layeradapt,oled,belady,full_residency",
    ],
    "fig13": ["cache=20,60"],
    "fig14": ["model=mini"],
    "fig15b": ["cache=20,60"],
    "fig15c": ["model=mini", "cache=40"],
    "fig16a": ["cache=40", "sim.batch_size=1,4"],
    "fig16b": ["block=1,4,16", "cache=40"],
    "fig17a": ["model=mini", "cache=40,256"],
    "fig17b": ["model=mini", "cache=40", "hw.pcie_gbps=16,64"],
}


# ---------------------------------------------------------------------------------------------- traces
# ---------------------------------------------------------------------------------------------- sweeps
def run_sweep(exp: str, work: Path, quick: bool, jobs: int, env: dict) -> pd.DataFrame:
    sweep = work / "sweeps" / exp
    # the work folder is this command's own: jobs of an earlier config are replaced (finished ones of this config
    # are kept and not recomputed)
    cmd = [
        sys.executable,
        "-m",
        "dllm_offload_sim.sim",
        f"experiment={exp}",
        f"hydra.sweep.dir={sweep}",
        f"hydra.launcher.n_jobs={jobs}",
        "overwrite=true",
    ] + (QUICK.get(exp, []) if quick else [])
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"sweep {exp} failed:\n{p.stderr[-3000:]}")
    r = collect(sweep)
    if not r.complete:
        raise RuntimeError(
            f"sweep {exp}: incomplete {r.incomplete}, stale {r.stale}, never started {r.missing}"
        )
    return r.table


# ---------------------------------------------------------------------------------------------- plots
class FigureWriter:
    """Saves each figure as PNG + PDF with its CSV, and remembers an index line per figure."""

    def __init__(self, out: Path):
        import matplotlib

        matplotlib.use("Agg")
        self.out = out
        self.entries = []
        self.stats_source = ""  # the traces the statistics figures (no simulation) read

    def save(self, fig, name: str, data: pd.DataFrame, title: str, note: str, source: str | None = None):
        """``source``: the traces and profile the figure shows (default: read from ``data``'s columns)."""
        import matplotlib.pyplot as plt

        fig.tight_layout()
        atomic_savefig(fig, self.out / f"{name}.png", dpi=130)
        atomic_savefig(fig, self.out / f"{name}.pdf")
        plt.close(fig)
        atomic_write_text(self.out / f"{name}.csv", data.to_csv(index=False))
        self.entries.append((name, title, note, source or simulated_on(data) or self.stats_source))


def simulated_on(data: pd.DataFrame) -> str:
    """The traces and profiles behind a sweep's rows, as a caption reads them."""
    parts = []
    if "trace" in data.columns:
        parts.append(
            "traces " + ", ".join(f"`{Path(str(t)).name}`" for t in sorted(set(data.trace.dropna())))
        )
    if "profile" in data.columns:
        profiles = sorted(set(data.profile.dropna()))
        parts.append(
            ("profile " if len(profiles) == 1 else "profiles ") + ", ".join(f"`{p}`" for p in profiles)
        )
    return "; ".join(parts)


def short(m: str) -> str:
    return m.replace("llada2-", "")


# one style for every figure: display names for policies, panel letters, real tick values on log axes
DISPLAY = {
    "naive_lru": "Naive-LRU",
    "lru": "LRU",
    "lfu": "LFU",
    "moe_infinity": "MoE-Infinity",
    "finemoe": "FineMoE",
    "ktransformers": "KTransformers",
    "fiddler": "Fiddler",
    "tide": "TIDE",
    "oled_priority": "OLED +Priority",
    "oled_priority_layeradapt": "OLED +LayerAdapt",
    "oled": "OLED-MoE",
    "belady": "Belady (bound)",
    "belady_shared": "Belady shared (bound)",
    "clairvoyant_coop": "clairvoyant coop",
    "full_residency": "full residency",
}


def display(policy: str) -> str:
    return DISPLAY.get(policy, policy)


def letter_panels(axes) -> None:
    """(a), (b), ... in the top-left corner of each panel of a multi-panel figure."""
    axes = list(np.ravel(axes))
    if len(axes) > 1:
        for i, ax in enumerate(axes):
            ax.text(
                -0.02,
                1.04,
                f"({chr(97 + i)})",
                transform=ax.transAxes,
                fontsize=10,
                fontweight="bold",
                ha="right",
                va="bottom",
            )


def log2_ticks(ax, values, axis: str = "x") -> None:
    """A log-2 axis labelled with the values themselves (16, 32, ... rather than 2^4, 2^5, ...)."""
    vals = sorted({float(v) for v in values})
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=2)
    (ax.set_xticks if axis == "x" else ax.set_yticks)(vals, [f"{v:g}" for v in vals])
    from matplotlib.ticker import NullLocator

    (ax.xaxis if axis == "x" else ax.yaxis).set_minor_locator(NullLocator())


def fig4(w: FigureWriter, stats: dict):
    import matplotlib.pyplot as plt

    rows = [
        {"model": short(m), "case": c, "distinct_experts": s.summary[k1], "expert_gflops": s.summary[k2]}
        for m, s in stats.items()
        for c, k1, k2 in (
            ("AR (1 token)", "distinct_experts_single_token", "expert_gflops_per_layer_token"),
            ("block 16", "distinct_experts_per_layer", "expert_gflops_per_layer_block"),
        )
    ]
    d = pd.DataFrame(rows)
    fig, ax = plt.subplots(1, 2, figsize=(8, 3.2))
    for i, col in enumerate(["distinct_experts", "expert_gflops"]):
        piv = d.pivot(index="model", columns="case", values=col)
        piv.plot.bar(ax=ax[i], rot=0)
        ax[i].set_ylabel(["distinct experts / MoE layer / forward", "expert GFLOPs / MoE layer / forward"][i])
        ax[i].set_xlabel("model")
    letter_panels(ax)
    w.save(
        fig,
        "fig04_footprint_flops",
        d,
        "Fig. 4: expert footprint and FLOPs, block 16 vs one token",
        "Synthetic traces; the AR footprint is the top-k of one token.",
    )


def fig7(w, stats):
    import matplotlib.pyplot as plt

    d = pd.concat([s.overlap.assign(model=short(m)) for m, s in stats.items()])
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for (m, k), g in d.groupby(["model", "kind"]):
        ax.plot(
            g.gap,
            100 * g.overlap,
            "o-" if k == "within_block" else "s--",
            label=f"{m}, {k.replace('_', ' ')}",
        )
    ax.axhspan(85, 90, color="green", alpha=0.12, label="paper: adjacent 85-90%")
    ax.axhline(65, color="red", ls=":", lw=0.8, label="paper: boundary > 65%")
    ax.set_xlabel("iteration gap")
    ax.set_ylabel("expert overlap (%)")
    ax.legend(fontsize=7)
    w.save(
        fig,
        "fig07_overlap",
        d,
        "Fig. 7: same-layer routing overlap vs iteration gap, within blocks and across block boundaries",
        "Hidden-state similarity (left panel of the paper) needs a collected trace with hidden "
        "states; not plotted.",
    )


def fig10(w, stats):
    import matplotlib.pyplot as plt

    conf = pd.concat([s.confidence.assign(model=short(m)) for m, s in stats.items()])
    layers = pd.concat([s.layers.assign(model=short(m)) for m, s in stats.items()])
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.3))
    for m, g in conf.groupby("model"):
        ax[0].plot((g.bin_lo + g.bin_hi) / 2, 100 * g.mean_stability, "o-", label=m)
    ax[0].set_xlabel("token confidence")
    ax[0].set_ylabel("experts kept next forward (%)")
    ax[0].legend()
    for m, g in layers.groupby("model"):
        ax[1].plot(g.layer, 100 * g.activation_ratio, "o-", label=m)
    ax[1].set_xlabel("MoE layer")
    ax[1].set_ylabel("activation ratio (%)")
    ax[1].legend()
    letter_panels(ax)
    w.save(
        fig,
        "fig10_confidence_layers",
        pd.concat([conf, layers]),
        "Fig. 10: confidence vs routing stability, and per-layer activation ratios",
        "Synthetic traces (stability is built into the generator).",
    )


def _bars(ax, d, value, policies, ylabel, log: bool = False):
    piv = d.pivot_table(index="policy", columns="cache", values=value).reindex(
        [p for p in policies if p in set(d.policy)]
    )
    piv.index = piv.index.map(display)
    piv.plot.bar(ax=ax, rot=60, logy=log)
    if log:  # plain numbers at 1, 2 and 5 of each decade (a range within one decade still gets labels)
        from matplotlib.ticker import LogLocator, NullFormatter, NullLocator, StrMethodFormatter

        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylabel(ylabel + (" (log scale)" if log else ""))
    ax.set_xlabel("")
    ax.legend(title="Cache", fontsize=7)


def fig5_12(w, t12):
    import matplotlib.pyplot as plt

    systems = (
        ["naive_lru", "lru", "lfu"] + BASELINES + ["fiddler", "tide", "oled", "belady", "full_residency"]
    )
    for name, pols, title in (
        (
            "fig05_baselines",
            BASELINES + ["naive_lru", "belady"],
            "Fig. 5: TPOT and cache utilisation of prior systems vs the retention bound (belady)",
        ),
        ("fig12_overall", systems, "Fig. 12: TPOT and cache utilisation of all systems"),
    ):
        d = t12[t12.policy.isin(pols)]
        models = sorted(d.model.unique())
        fig, ax = plt.subplots(2, len(models), figsize=(5.5 * len(models), 6.5), squeeze=False)
        for i, m in enumerate(models):
            dm = d[d.model == m]
            _bars(
                ax[0, i], dm, "tpot_ms", pols, "TPOT (ms)", log=True
            )  # KTransformers would flatten the rest
            ax[0, i].set_title(short(m))
            _bars(ax[1, i], dm, "cache_util", pols, "cache utilisation")
        letter_panels(ax)
        w.save(
            fig,
            name,
            d[
                [
                    "model",
                    "policy",
                    "cache",
                    "tpot_ms",
                    "cache_util",
                    "hit_rate",
                    "h2d_gb",
                    "cpu_experts",
                    "trace",
                    "profile",
                ]
            ],
            title,
            "One synthetic 'dataset' per model; the paper's per-dataset bars (GSM8K, HumanEval, GPQA) need "
            "collected traces.",
        )


def fig13(w, t):
    import matplotlib.pyplot as plt

    p = t.pivot_table(index="cache", columns="policy", values="tpot_ms").reset_index()
    p = p.merge(t.groupby("cache").tpot_bound_ms.first().reset_index(), on="cache")
    p["gap_pct"] = 100 * (p["oled"] / p["tpot_bound_ms"] - 1)
    p["gap_belady_pct"] = 100 * (p["oled"] / p["belady"] - 1)
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    ax.plot(p.cache, p.gap_pct, "o-", label="above the TPOT bound (every policy)")
    ax.plot(p.cache, p.gap_belady_pct, "s--", label="above belady (the paper's ideal cache bound)")
    ax.axhspan(1.93, 15.22, color="green", alpha=0.12, label="paper: 1.93-15.22%")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xlabel("Cache (slots per MoE layer)")
    ax.set_ylabel("OLED TPOT above the bound (%)")
    ax.legend(fontsize=7)
    w.save(
        fig,
        "fig13_gap_to_bound",
        p,
        "Fig. 13: gap between OLED-MoE and the TPOT bound (sim/bound.py: no "
        "policy with the same slots goes below it), and the paper's ideal cache bound (belady)",
        "mini shape. belady bounds misses and copies, not the TPOT of a policy that runs experts on the CPU, so "
        "OLED can be below it; nothing is below the TPOT bound.",
        source=simulated_on(t),
    )


def fig14(w, pf):
    import matplotlib.pyplot as plt

    pre = pf[pf.phase == 0].copy()
    pre["non_expert_ms"] = 1e3 * pre.nonexpert_s
    pre["expert_compute_ms"] = 1e3 * pre.resident_expert_s
    pre["miss_compensation_ms"] = 1e3 * (pre.duration_s - pre.nonexpert_s - pre.resident_expert_s)
    d = (
        pre.groupby(["model", "policy", "trace", "profile"])[
            ["non_expert_ms", "expert_compute_ms", "miss_compensation_ms"]
        ]
        .mean()
        .reset_index()
    )
    fig, ax = plt.subplots(figsize=(6, 3.3))
    lab = d.model.map(short) + "\n" + d.policy.map(display)
    bottom = np.zeros(len(d))
    for col in ["non_expert_ms", "expert_compute_ms", "miss_compensation_ms"]:
        ax.bar(lab, d[col], bottom=bottom, label=col.replace("_ms", "").replace("_", " "))
        bottom += d[col].to_numpy()
    ax.set_ylabel("prefill forward (ms)")
    ax.legend(fontsize=7)
    w.save(
        fig,
        "fig14_ttft_breakdown",
        d,
        "Fig. 14: prefill (TTFT) breakdown at Cache 100",
        "Expert compute = the grouped calls had every activated expert been resident; miss compensation = the rest.",
    )


def fig15(w, t12, t15b, t15c):
    import matplotlib.pyplot as plt

    lad = t12[t12.policy.isin(LADDER)]
    fig, ax = plt.subplots(1, 4, figsize=(16, 3.5))
    for (m, c), g in lad.groupby(["model", "cache"]):
        g = g.set_index("policy").reindex(LADDER)
        ax[0].plot(range(4), g.tpot_ms, "o-", label=f"{short(m)}, Cache {c}")
    ax[0].set_xticks(range(4), ["Naive-LRU", "+Priority", "+LayerAdapt", "+Coop"], rotation=20)
    ax[0].set_yscale("log")  # flash's TPOTs are several times mini's: one linear axis flattens mini
    from matplotlib.ticker import LogLocator, NullLocator, StrMethodFormatter

    ax[0].yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax[0].yaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
    ax[0].yaxis.set_minor_locator(NullLocator())
    ax[0].set_ylabel("TPOT (ms, log scale)")
    ax[0].legend(fontsize=7)
    for p, g in t15b[t15b.policy.isin(["lru", "lfu", "oled_priority"])].groupby("policy"):
        g = g.sort_values("cache")  # (a sweep's rows come in job order)
        ax[1].plot(g.cache, g.cache_util, "o-", label={"oled_priority": "Priority"}.get(p, display(p)))
    ax[1].set_xlabel("Cache (slots per MoE layer)")
    ax[1].set_ylabel("cache utilisation")
    ax[1].legend()
    for p, g in t15b[t15b.policy.isin(["oled_priority", "oled_priority_layeradapt"])].groupby("policy"):
        g = g.sort_values("cache")
        ax[2].plot(g.cache, g.cache_util, "o-", label="LayerAdapt" if "layer" in p else "uniform")
    ax[2].set_xlabel("Cache (slots per MoE layer)")
    ax[2].set_ylabel("cache utilisation")
    ax[2].legend()
    t15c = t15c.assign(
        dispatch=np.where(
            t15c["override.policy.reuse_aware"].astype(str).str.lower() == "true", "reuse-aware", "load-only"
        )
    )
    piv = t15c.pivot_table(
        index=[t15c.model.map(short), "cache"], columns="dispatch", values="effective_transfer_ratio"
    )
    piv.index = [f"{m}, Cache {c}" for m, c in piv.index]  # (not pandas' tuple labels)
    piv.plot.bar(ax=ax[3], rot=20)
    ax[3].set_xlabel("")
    ax[3].set_ylabel("effective transfer ratio")
    ax[3].legend(title="dispatch", fontsize=7)
    letter_panels(ax)
    data = pd.concat(
        [lad.assign(panel="ladder"), t15b.assign(panel="retention"), t15c.assign(panel="dispatch")]
    )
    w.save(
        fig,
        "fig15_ablation",
        data[
            [
                "panel",
                "model",
                "policy",
                "cache",
                "tpot_ms",
                "cache_util",
                "effective_transfer_ratio",
                "trace",
                "profile",
            ]
        ],
        "Fig. 15: ablation ladder; Priority vs LRU/LFU; LayerAdapt vs uniform; reuse-aware vs load-only dispatch",
        "",
    )


def fig16(w, ta, tb):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(13, 3.4))
    for c, g in ta.groupby("cache"):
        g = g.sort_values("batch_size")
        ax[0].plot(g.batch_size, g.tpot_ms, "o-", label=f"Cache {c}")
        layers = g.model.map({"llada2-mini": 19, "llada2-flash": 31})
        ax[1].plot(
            g.batch_size,
            g.activations / (g.forwards * layers * 256),
            "o-",
            label=f"activation ratio, Cache {c}",
        )
        ax[1].plot(g.batch_size, g.cache_util, "s--", label=f"utilisation, Cache {c}")
    log2_ticks(ax[0], ta.batch_size)
    ax[0].set_xlabel("batch size")
    ax[0].set_ylabel("TPOT (ms)")
    ax[0].legend()
    log2_ticks(ax[1], ta.batch_size)
    ax[1].set_xlabel("batch size")
    ax[1].set_ylabel("fraction")
    ax[1].legend(fontsize=7)
    tb = tb.assign(block=tb["override.block"].astype(int))
    for c, g in tb.groupby("cache"):
        g = g.sort_values("block")
        ax[2].plot(g.block, g.tpot_ms, "o-", label=f"Cache {c}")
        best = g.loc[g.tpot_ms.idxmin()]
        ax[2].scatter([best.block], [best.tpot_ms], s=120, facecolors="none", edgecolors="k")
    log2_ticks(ax[2], tb.block)
    ax[2].set_yscale("log")
    ax[2].set_xlabel("block length")
    ax[2].set_ylabel("TPOT (ms, log scale)")
    ax[2].legend(fontsize=7)
    letter_panels(ax)
    w.save(
        fig,
        "fig16_batch_block",
        pd.concat([ta.assign(panel="batch"), tb.assign(panel="block")]),
        "Fig. 16: batch size 1-32 (TPOT, activation ratio, utilisation); block length x cache (circles: best "
        "block per cache)",
        "Block-length traces are synthetic with the same generator settings.",
    )


def fig17(w, ta, tb, t12):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.4))
    for m, g in ta.groupby("model"):
        g = g.sort_values("cache")
        ax[0].plot(g.cache, g.tpot_ms, "o-", label=short(m))
        full = t12[(t12.model == m) & (t12.policy == "full_residency")].tpot_ms
        if len(full):
            ax[0].axhline(full.iloc[0], ls=":", lw=0.8, color=ax[0].lines[-1].get_color())
    ax[0].set_xlabel("Cache (256 = full residency)")
    ax[0].set_ylabel("TPOT (ms)")
    ax[0].legend()
    for (m, c), g in tb.groupby(["model", "cache"]):
        g = g.sort_values("pcie_gbps")
        ax[1].plot(g.pcie_gbps, g.tpot_ms, "o-", label=f"{short(m)}, Cache {c}")
    log2_ticks(ax[1], tb.pcie_gbps)
    ax[1].set_xlabel("PCIe bandwidth (GB/s)")
    ax[1].set_ylabel("TPOT (ms)")
    ax[1].legend()
    letter_panels(ax)
    w.save(
        fig,
        "fig17_cache_pcie",
        pd.concat([ta.assign(panel="cache"), tb.assign(panel="pcie")]),
        "Fig. 17: TPOT vs cache capacity (dotted: full residency) and vs PCIe bandwidth",
        "",
    )


def fig18(w, t12):
    import matplotlib.pyplot as plt

    d = t12[t12.policy == "oled"][
        ["model", "cache", "policy_ms_per_forward", "tpot_ms", "tokens_per_forward", "trace", "profile"]
    ].copy()
    d["forward_ms"] = d.tpot_ms * d.tokens_per_forward
    d["overhead_pct_of_forward"] = 100 * d.policy_ms_per_forward / d.forward_ms
    d["where"] = "this machine (simulator)"
    gpu = _gpu_host_decision_ms()
    fig, ax = plt.subplots(figsize=(6, 3.3))
    lab = list(d.model.map(short) + ", Cache " + d.cache.astype(str) + "\n(this machine)")
    vals = list(d.policy_ms_per_forward)
    if gpu is not None:
        lab.append("mini, Cache 40\n(H100 host, replay)")
        vals.append(gpu)
        d = pd.concat(
            [
                d,
                pd.DataFrame(
                    [
                        {
                            "model": "llada2-mini",
                            "cache": 40,
                            "policy_ms_per_forward": gpu,
                            "where": "H100 host (validation replay, measured)",
                        }
                    ]
                ),
            ],
            ignore_index=True,
        )
    ax.bar(lab, vals, color=["C0"] * (len(vals) - (gpu is not None)) + (["C1"] if gpu is not None else []))
    ax.set_ylabel("OLED decision time per forward (ms)")
    w.save(
        fig,
        "fig18_policy_overhead",
        d,
        "Fig. 18b: OLED-MoE policy overhead per forward",
        "Blue: the decision time measured while simulating, on the machine that ran this command (its CPU, not "
        "the GPU host's). Orange: OLED's at Cache 40 in the validation replays on the H100 host, the median of "
        "3 (validation/h100/mini). Fig. 18a (LLaDA2.1) needs LLaDA2.1 traces: not supported by the data.",
    )


def _gpu_host_decision_ms():
    """OLED's decision time per forward at mini Cache 40, measured on the H100 host by the committed validation."""
    f = ROOT / "validation" / "h100" / "mini" / "fidelity.parquet"
    if not f.is_file():
        return None
    t = pd.read_parquet(f)
    v = t[(t.policy == "oled") & (t.cache == 40) & (t.metric == "policy_ms_per_forward")].measured
    return float(v.median()) if len(v) else None


# ---------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python notebooks/figures.py",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--out",
        default=None,
        help="output folder (default: figures/, with --quick figures/_quick/ so the paper's figures stay)",
    )
    p.add_argument(
        "--quick", action="store_true", help="reduced sweeps and short traces (26 s on a 2-core machine)"
    )
    p.add_argument(
        "--jobs", type=positive_int, default=2, help="parallel simulation jobs (joblib launcher), >= 1"
    )
    args = p.parse_args(argv)
    out = Path(args.out or ROOT / "figures" / ("_quick" if args.quick else "")).resolve()
    work = out / "_work"
    output_folder(out, "figures")
    t0 = time.time()
    from tqdm import tqdm

    steps = ["traces"] + EXPERIMENTS + ["figures"]
    bar = tqdm(total=len(steps), desc="figures", unit="step")
    traces = make_figure_traces(work / "traces", args.quick)
    bar.update(1)
    env = dict(
        os.environ,
        DLLM_FIG_TRACES=str(work / "traces"),
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    tables = {}
    for exp in EXPERIMENTS:
        bar.set_postfix_str(exp)
        tables[exp] = run_sweep(exp, work, args.quick, args.jobs, env)
        bar.update(1)
    bar.set_postfix_str("plotting")
    stats = {}
    for name in ("mini_b16", "flash_b16"):
        if name in traces:
            tr = Trace.open(traces[name])
            stats[tr.topology.name] = compute_stats(tr, max_gap=6)
    w = FigureWriter(out)
    w.stats_source = (
        "traces "
        + ", ".join(f"`{traces[n].name}`" for n in ("mini_b16", "flash_b16") if n in traces)
        + " (their statistics; no simulation)"
    )
    fig4(w, stats)
    fig5_12(w, tables["fig12"])
    fig7(w, stats)
    fig10(w, stats)
    fig13(w, tables["fig13"])
    fig14(w, _fig14_frame(work))
    fig15(w, tables["fig12"], tables["fig15b"], tables["fig15c"])
    fig16(w, tables["fig16a"], tables["fig16b"])
    fig17(w, tables["fig17a"], tables["fig17b"], tables["fig12"])
    fig18(w, tables["fig12"])
    prof = pd.concat(tables.values())[["model", "profile", "profile_status"]].drop_duplicates()
    note = (
        "Traces: synthetic (`traces.synth`, the paper calibration). Profiles: "
        + ", ".join(f"{r.profile} ({r.profile_status})" for r in prof.sort_values("profile").itertuples())
        + "."
        + (" Quick mode: reduced sweeps." if args.quick else "")
        + " The paper's numeric claims beside ours, factor by factor: `dllm-reproduce` (docs/reproduction.md)."
    )
    idx = [
        "# Figures",
        "",
        f"Generated by `python notebooks/figures.py{' --quick' if args.quick else ''}`. {note}",
        "",
        "| file | shows | simulated on | differs from the paper |",
        "|---|---|---|---|",
    ]
    idx += [
        f"| [{n}.png]({n}.png) ([pdf]({n}.pdf), [csv]({n}.csv)) | {t} | {src} | {nt} |"
        for n, t, nt, src in w.entries
    ]
    idx += [
        "",
        "Not produced: Fig. 18a (LLaDA2.0 vs 2.1) needs LLaDA2.1 traces; the hidden-state panel of Fig. 7 "
        "needs a collected trace with hidden states; per-dataset bars need collected traces.",
        "",
    ]
    atomic_write_text(out / "index.md", "\n".join(idx))
    bar.update(1)
    bar.close()
    print(f"wrote {len(w.entries)} figures and index.md to {out} in {time.time() - t0:.0f} s")
    return 0


def _fig14_frame(work: Path) -> pd.DataFrame:
    frames = []
    sweep = work / "sweeps" / "fig14"
    for d in sorted(sweep.iterdir()):
        f = d / "per_forward.parquet"
        if (d / "done.json").is_file() and f.is_file():
            s = pd.read_parquet(d / "summary.parquet")
            frames.append(
                pd.read_parquet(f).assign(
                    model=s.model.iloc[0],
                    policy=s.policy.iloc[0],
                    trace=s.trace.iloc[0],
                    profile=s.profile.iloc[0],
                )
            )
    return pd.concat(frames, ignore_index=True)


if __name__ == "__main__":
    sys.exit(run_cli(main))
