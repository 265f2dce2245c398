"""How the host's CPU path moved over a validation sweep, read from the repeats the sweep stored.

Every repeat of a run replays the same simulated schedule, so the run predicts one CPU path for all of them. Each
stored repeat's decode forwards' measured CPU path over that prediction (its *CPU path ratio*), set against the wall
time the repeat finished, tells two causes of a CPU-path error apart:

- the model is off: a run's repeats agree with each other, and the ratio follows the workload (the cache, the
  policy) wherever in the sweep the run was replayed;
- the host moved: the same run's repeats disagree, and runs of every cache replayed in the same minutes move
  together.

The probes each repeat takes before its replay, the host's memory bandwidth (``host_mem_gbps``) and the CPU engine's
probe call (``cpu_probe_ms``, repeats since the probe existed), are set beside the ratio with their correlations, to
show whether a probe follows what the CPU path did; so is the share of CPU time the hypervisor stole during the
replay (``host_steal_frac``).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from dllm_offload_sim.traces.schema import PREFILL
from dllm_offload_sim.validate.comparison import measured_cpu_path_s
from dllm_offload_sim.validate.run_store import RunStore


class RepeatDrift(NamedTuple):
    """One stored repeat of a run with a CPU path: when it finished (wall clock), its decode forwards' measured CPU
    path over the run's predicted one, its TPOT, the host memory bandwidth and CPU engine probe call before it and
    the share of CPU time stolen during it (NaN where the repeat has no such probe)."""

    policy: str
    cache: int
    repeat: int
    finished_unix_s: float
    cpu_path_ratio: float
    tpot_ms: float
    host_mem_gbps: float
    cpu_probe_ms: float
    host_steal_frac: float


def repeat_drift(run_dir) -> pd.DataFrame:
    """A row (:class:`RepeatDrift`) per stored repeat of every finished run of ``run_dir`` (a ``dllm-validate``
    run directory) that predicts a CPU path, in the order the repeats finished (repeats stored without the time
    they finished come last, NaN; a ratio is NaN where the engine timed no CPU path). Empty where no run kept its
    repeats."""
    store = RunStore(Path(run_dir))
    rows = []
    for label, cache, key, d in store.finished_runs():
        try:
            fw = pd.read_parquet(d / "forwards.parquet")
        except (OSError, ValueError) as e:
            raise ValueError(f"{d}: unreadable finished run ({e})") from e
        decode = (fw.phase != PREFILL).to_numpy()
        predicted = (
            float(fw.predicted_cpu_path_s.to_numpy()[decode].sum()) if "predicted_cpu_path_s" in fw else 0.0
        )
        if not predicted > 0:
            continue
        for tables, m in store.load_repeats(label, cache, key):
            f = tables["forwards"]
            if len(f) != len(fw):
                raise ValueError(f"{d}: repeat {m['repeat']} has {len(f)} forwards, the run {len(fw)}")
            timed = decode & f.measured.to_numpy(bool)
            measured = float(measured_cpu_path_s(f)[timed].sum())
            # 0: the engine timed no CPU path (the native engine on a CPU device times its calls on a GPU's clock)
            ratio = (
                measured / float(fw.predicted_cpu_path_s.to_numpy()[timed].sum())
                if measured > 0
                else float("nan")
            )
            s = m["summary"]
            rows.append(
                RepeatDrift(
                    label,
                    int(cache),
                    int(m["repeat"]),
                    float(m.get("finished_unix_s", float("nan"))),
                    ratio,
                    float(s["tpot_ms"]),
                    *(
                        float(s.get(k, float("nan")))
                        for k in ("host_mem_gbps", "cpu_probe_ms", "host_steal_frac")
                    ),
                )
            )
    out = pd.DataFrame(rows, columns=RepeatDrift._fields)
    return out.sort_values(
        ["finished_unix_s", "policy", "cache"], na_position="last", kind="stable", ignore_index=True
    )


def drift_lines(drift: pd.DataFrame) -> list[str]:
    """What :func:`repeat_drift`'s rows say, as report bullets: the ratio's spread over the sweep and within each
    run, how it moved in time, and whether the memory-bandwidth probe followed it."""
    drift = drift[drift.cpu_path_ratio.notna()]
    if drift.empty:
        return []
    r = drift.cpu_path_ratio
    runs = drift.groupby(["policy", "cache"]).cpu_path_ratio
    within = (runs.max() - runs.min()) / runs.median()
    worst = within.idxmax()
    lines = [
        f"CPU path, measured over predicted, per repeat: median {r.median():.2f}, range {r.min():.2f} .. "
        f"{r.max():.2f} over {len(drift)} repeats of {runs.ngroups} runs.",
        f"Within a run (the same schedule replayed at other times), the repeats' ratios spread by a median of "
        f"{within.median():.0%} of the run's, at most {within.max():.0%} ({worst[0]}, Cache {worst[1]}: "
        + ", ".join(
            f"{x:.2f}" for x in drift[(drift.policy == worst[0]) & (drift.cache == worst[1])].cpu_path_ratio
        )
        + ").",
    ]
    timed = drift[drift.finished_unix_s.notna()]
    if len(timed) >= 6:
        minutes = (timed.finished_unix_s - timed.finished_unix_s.min()) / 60
        edges = np.linspace(0, minutes.max() + 1e-9, 5)
        parts = []
        dec = 0 if edges[1] >= 5 else 1  # quarters shorter than 5 minutes: in tenths of a minute
        for a, b in zip(edges[:-1], edges[1:]):
            g = timed[(minutes >= a) & (minutes < b)]
            if len(g):
                parts.append(
                    f"{a:.{dec}f}-{b:.{dec}f} min: {g.cpu_path_ratio.median():.2f} "
                    f"(Cache {', '.join(map(str, sorted(g.cache.unique())))})"
                )
        lines.append("Median ratio by the time the repeats finished: " + "; ".join(parts) + ".")
    for col, what, unit in (
        ("host_mem_gbps", "host memory bandwidth", "GB/s"),
        ("cpu_probe_ms", "CPU engine's probe call", "ms"),
    ):
        probed = drift[drift[col].notna()]
        if len(probed) >= 3 and probed[col].std() > 0 and probed.cpu_path_ratio.std() > 0:
            rho = float(np.corrcoef(probed[col], probed.cpu_path_ratio)[0, 1])
            lines.append(
                f"The {what} probed before each repeat ({probed[col].min():.3g} .. {probed[col].max():.3g} "
                f"{unit}) correlates with the ratio at r = {rho:+.2f}."
            )
    steal = drift.host_steal_frac.dropna()
    if len(steal):
        lines.append(
            f"The hypervisor stole {100 * steal.median():.2f}% of the CPU time during the median repeat, at "
            f"most {100 * steal.max():.2f}%."
        )
    return lines


def drift_table(drift: pd.DataFrame) -> str:
    """:func:`repeat_drift`'s rows as a Markdown table, minutes counted from the first repeat."""
    t0 = drift.finished_unix_s.min()
    num = lambda v, fmt: "" if v != v else format(v, fmt)  # noqa: E731  (NaN: not measured)
    out = [
        "| finished min | policy | Cache | repeat | CPU path measured / predicted | TPOT ms | host memory GB/s | "
        "CPU engine probe ms | stolen CPU % |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in drift.itertuples():
        out.append(
            f"| {num((r.finished_unix_s - t0) / 60, '.1f')} | {r.policy} | {r.cache} | {r.repeat} | "
            f"{num(r.cpu_path_ratio, '.2f')} | {r.tpot_ms:.2f} | {num(r.host_mem_gbps, '.1f')} | "
            f"{num(r.cpu_probe_ms, '.3f')} | {num(100 * r.host_steal_frac, '.2f')} |"
        )
    return "\n".join(out) + "\n"


def plot_drift(drift: pd.DataFrame, out: Path) -> list[Path]:
    """The CPU path ratio of every repeat against the minutes since the sweep's first, one colour per cache, one
    marker per policy; the same run's repeats joined by a thin line. Writes ``out`` as PNG and PDF."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dllm_offload_sim.traces.atomic import atomic_savefig_png_pdf

    timed = drift[drift.finished_unix_s.notna() & drift.cpu_path_ratio.notna()]
    if timed.empty:
        raise ValueError(
            "no stored repeat carries both the time it finished (finished_unix_s) and a timed CPU path: "
            "nothing to plot"
        )
    minutes = (timed.finished_unix_s - timed.finished_unix_s.min()) / 60
    fig, ax = plt.subplots(figsize=(7, 3.8))
    caches = sorted(timed.cache.unique())
    cmap = plt.get_cmap("viridis")
    colour = {c: cmap(i / max(1, len(caches) - 1)) for i, c in enumerate(caches)}
    markers = dict(zip(dict.fromkeys(timed.policy), "os^Dv<>ph*P"))
    for (pol, c), g in timed.assign(minutes=minutes).groupby(["policy", "cache"], sort=False):
        ax.plot(g.minutes, g.cpu_path_ratio, "-", color=colour[c], lw=0.6, alpha=0.5)
        ax.scatter(g.minutes, g.cpu_path_ratio, color=colour[c], marker=markers[pol], s=26, zorder=3)
    ax.axhline(1.0, color="k", lw=1)
    ax.axhspan(0.9, 1.1, color="tab:green", alpha=0.12, lw=0)
    for c in caches:
        ax.scatter([], [], color=colour[c], marker="o", label=f"Cache {c}")
    for pol, mk in markers.items():
        ax.scatter([], [], color="grey", marker=mk, label=pol)
    ax.set_xlabel("minutes since the sweep's first repeat finished")
    ax.set_ylabel("CPU path, measured / predicted")
    ax.set_title("CPU path per repeat over the sweep (same run: joined)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2, loc="upper left")
    fig.tight_layout()
    paths = atomic_savefig_png_pdf(fig, out)
    plt.close(fig)
    return paths
