"""REPRODUCTION.md and its figures, from the finished runs of the ladder and the sensitivity sweeps.

Every number in the outputs is computed here from the runs (``WORK/runs``) and the traces: nothing is written by
hand. The outputs: ``REPRODUCTION.md``; ``claims.csv`` (every claim on every rung); ``runs.csv`` (every run the
claims read); ``sensitivity.csv``; ``ladder.png`` and ``sensitivity.png`` (each also as PDF).
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from dllm_offload_sim.reproduce.claims import CLAIMS, RungResults, evaluate, verdict
from dllm_offload_sim.reproduce.jobs import load_result, trace_path
from dllm_offload_sim.reproduce.sensitivity import SWEEPS, trace_properties
from dllm_offload_sim.reproduce.setups import LADDER, Plan, Setup
from dllm_offload_sim.traces.analytics import compute_stats
from dllm_offload_sim.traces.atomic import atomic_savefig_png_pdf, atomic_write_text
from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.traces.shipped import REAL_TRACES, shipped_trace_path

BY_ID = {c.id: c for c in CLAIMS}


class Incomplete(RuntimeError):
    """A run the report needs has no result yet."""


def runs_table(plan: Plan, work: Path) -> pd.DataFrame:
    """One row per (setup, job) with the job's result; raises :class:`Incomplete` where one is missing."""
    rows, missing = [], 0
    for s in plan.setups:
        for j in plan.by_setup[s.name]:
            r = load_result(work, j)
            if r is None:
                missing += 1
                continue
            rows.append(
                {
                    "setup": s.name,
                    "policy": j.policy.name,
                    "cache": j.cache,
                    "trace_kind": j.trace.kind,
                    "new_tokens": j.trace.new_tokens,
                    "requests": j.trace.n_requests,
                    **r,
                    "model": j.trace.model,
                }
            )
    if missing:
        raise Incomplete(
            f"{missing} runs have no result under {work}/runs; run dllm-reproduce again to finish them"
        )
    return pd.DataFrame(rows)


def trace_stats(plan: Plan, work: Path) -> dict:
    """(setup, model) -> the summary statistics of the trace the setup replays for the model."""
    cache, out = {}, {}
    for s in plan.setups:
        for m in plan.models:
            spec = s.trace(m, plan.tokens_total, plan.real_requests)
            if spec not in cache:
                tr = Trace.open(trace_path(spec, work))
                ids = tr.request_ids[: spec.n_requests] if spec.kind == "real" else None
                cache[spec] = compute_stats(tr, requests=ids, max_gap=1).summary
            out[(s.name, m)] = cache[spec]
    return out


def claims_table(plan: Plan, runs: pd.DataFrame, stats: dict) -> pd.DataFrame:
    """One row per (setup, claim): our values and the verdict."""
    rows = []
    for s in plan.setups:
        r = RungResults(runs[runs.setup == s.name], {m: stats[(s.name, m)] for m in plan.models})
        for cid, v in evaluate(r).items():
            c = BY_ID[cid]
            rows.append(
                {"setup": s.name, "claim": cid, "values": v, "shown": c.show(v), "verdict": verdict(c, v)}
            )
    return pd.DataFrame(rows)


def _move(claim, a, b) -> float:
    """How far a claim's values moved from ``a`` to ``b``, each number relative to the paper's."""
    if a is None or b is None:
        return math.nan
    d = [
        abs(y - x) / max(abs(p), 1e-9)
        for p, x, y in zip(claim.paper_values, a, b)
        if not (math.isnan(x) or math.isnan(y))
    ]
    return max(d) if d else math.nan


def biggest_step(claim, setups: list[Setup], values: dict) -> str:
    """The step of the ladder (a rung from the one before it; branches aside) that moves ``claim`` most, each number
    measured relative to the paper's."""
    best, text = 0.0, "none"
    for s in setups:
        if s.parent is None or s.branch:
            continue
        m = _move(claim, values[s.parent], values[s.name])
        if not math.isnan(m) and m > best + 1e-12:
            best = m
            text = (
                f"`{s.name}`: {s.change.split(':')[0]} ({claim.show(values[s.parent])} -> "
                f"{claim.show(values[s.name])})"
            )
    return text


def testbed_range(claim, setups: list[Setup], values: dict) -> str:
    """Each number's range over the paper's setup and its testbed-assumption branches."""
    vs = [values[s.name] for s in setups if s.name == "paper" or s.name.startswith("paper_")]
    vs = [v for v in vs if v is not None and not any(math.isnan(x) for x in v)]
    if not vs:
        return "n/a"
    lo, hi = np.min(vs, axis=0), np.max(vs, axis=0)
    return " / ".join(f"{claim.fmt.format(a)}..{claim.fmt.format(b)}{claim.unit}" for a, b in zip(lo, hi))


def final_rung(setups: list[Setup]) -> Setup:
    """The last rung of the ladder (not a branch): the project's validated setup."""
    return [s for s in setups if not s.branch][-1]


def reproduction_md(
    plan: Plan, claims: pd.DataFrame, sens: pd.DataFrame | None, command: str, quick: bool = False
) -> str:
    setups = plan.setups
    values = {(r.setup, r.claim): r.values for r in claims.itertuples()}
    shown = {(r.setup, r.claim): (r.shown, r.verdict) for r in claims.itertuples()}
    ours = final_rung(setups).name
    lines = [
        "# The OLED-MoE paper's claims, reproduced and explained",
        "",
        f"Generated by `{command}` (docs/reproduction.md): every number below comes from the simulator's runs "
        "and the traces; none is written by hand. Each rung of the ladder changes one factor of the rung "
        "before it, from the paper's setup to the project's validated one; branches change one factor of a "
        "rung without the ladder continuing from them."
        + (
            " **Quick mode**: short traces and mini only, so the rungs' lengths and counts differ from the full "
            "run's; not the committed reproduction."
            if quick
            else ""
        ),
        "",
        "| rung | what changes | host | traces (requests x new tokens) | OLED switches on the paper's side | "
        "warm-up |",
        "|---|---|---|---|---|---|",
    ]
    for s in setups:
        sw = "all 8" if len(s.paper_switches) == 8 else (", ".join(sorted(s.paper_switches)) or "none (ours)")
        traces = "; ".join(
            f"{m} {t.kind} {t.n_requests} x {t.new_tokens}"
            for m in plan.models
            for t in [s.trace(m, plan.tokens_total, plan.real_requests)]
        )
        lines.append(
            f"| `{s.name}`{' (branch)' if s.branch else ''} | {s.change} | {s.hardware.label()} | "
            f"{traces} | {sw} | {'dummy request' if s.warmup else 'cold'} |"
        )
    lines += [
        "",
        "## Every claim",
        "",
        f"*Paper setup*: the `paper` rung (its range: over the testbed's assumptions, the `paper_*` branches). "
        f"*Validated host*: the `{ours}` rung, the project's setup (the H100 profile validated on the GPU, the "
        "real trace, OLED as the project reads it). Verdicts: reproduced (within 20% of a ratio, 5 points of a "
        "percentage, inside a band, a bound met), direction holds, partly, not reproduced "
        "(`reproduce/claims.py`).",
        "",
        "| claim | § | paper | paper setup | its range | verdict | validated host | verdict | the factor that "
        "moves it most |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    vals = {s.name: None for s in setups}
    for c in CLAIMS:
        for s in setups:
            vals[s.name] = values.get((s.name, c.id))
        p_show, p_v = shown[("paper", c.id)]
        o_show, o_v = shown[(ours, c.id)]
        lines.append(
            f"| {c.text} | {c.section} | {c.paper} | {p_show} | {testbed_range(c, setups, vals)} | {p_v} | "
            f"{o_show} | {o_v} | {biggest_step(c, setups, vals)} |"
        )
    lines += [
        "",
        "## The ladder",
        "",
        "![ladder](ladder.png)",
        "",
        "Each claim's numbers on every rung and branch are in `claims.csv`; every run they come from in "
        "`runs.csv`.",
        "",
        "| claim | " + " | ".join(f"`{s.name}`" for s in setups) + " |",
        "|---" * (len(setups) + 1) + "|",
    ]
    for c in CLAIMS:
        lines.append(f"| {c.id} | " + " | ".join(shown[(s.name, c.id)][0] for s in setups) + " |")
    if sens is not None and len(sens):
        lines += [
            "",
            "## Trace properties",
            "",
            "![sensitivity](sensitivity.png)",
            "",
            "Each OLED rung's TPOT reduction over Naive-LRU on synthetic traces (mini, the H100 profile, OLED as "
            "the project reads it) whose one property moves (`reproduce/sensitivity.py`); the shipped real "
            "traces' properties are marked, and the paper's where it states a number. Rows: `sensitivity.csv`.",
            "",
            "| property | trace | value | "
            + " | ".join(f"{p} @{c}" for p in LADDER[1:] for c in sorted(set(sens.cache)))
            + " |",
            "|---|---|---|" + "---|" * (len(LADDER[1:]) * len(set(sens.cache))),
        ]
        for (prop, point), g in sens.groupby(["property", "point"], sort=False):
            cells = [
                f"{100 * g[(g.policy == p) & (g.cache == c)].gain.iloc[0]:+.1f}%"
                for p in LADDER[1:]
                for c in sorted(set(sens.cache))
            ]
            lines.append(f"| {prop} | point {point} | {g.value.iloc[0]:.3f} | " + " | ".join(cells) + " |")
        real = sens.attrs.get("real", {})
        for name, props in real.items():
            lines.append(
                f"| (real) | {name} | "
                + ", ".join(f"{k} {v:.3f}" for k, v in props.items())
                + " |"
                + " |" * (len(LADDER[1:]) * len(set(sens.cache)))
            )
    return "\n".join(lines) + "\n"


def ladder_figure(plan: Plan, claims: pd.DataFrame, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rungs = [s for s in plan.setups if not s.branch]
    shown = [c for c in CLAIMS if c.kind not in ("band", "bound", "sign")]
    values = {(r.setup, r.claim): r.values for r in claims.itertuples()}
    cols = 4
    rows = math.ceil(len(shown) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    x = np.arange(len(rungs))
    for ax, c in zip(axes.ravel(), shown):
        for i, p in enumerate(c.paper_values):
            ys = [values[(s.name, c.id)][i] if values[(s.name, c.id)] else np.nan for s in rungs]
            (line,) = ax.plot(x, ys, "o-", ms=3)
            ax.axhline(p, ls="--", lw=0.8, color=line.get_color())
        ax.set_title("\n".join(textwrap.wrap(f"{c.text} ({c.section})", 52)), fontsize=7.5)
        ax.set_xticks(x, [s.name for s in rungs], rotation=70, fontsize=6)
        ax.tick_params(axis="y", labelsize=7)
        ax.set_ylabel(c.unit.strip() or "experts", fontsize=7)
    for ax in axes.ravel()[len(shown) :]:
        ax.axis("off")
    fig.suptitle("Each claim along the ladder (lines: ours per rung; dashed: the paper's)", fontsize=10)
    fig.tight_layout()
    paths = atomic_savefig_png_pdf(fig, out / "ladder")
    plt.close(fig)
    return paths


def sensitivity_table(work: Path, traces, jobs_by_trace: dict) -> pd.DataFrame:
    """One row per (property, point, policy, cache): the trace's measured property and the rung's gain over
    Naive-LRU; ``attrs['real']`` holds the shipped real traces' properties."""
    rows = []
    for sw, i, spec in traces:
        props = trace_properties(compute_stats(Trace.open(trace_path(spec, work)), max_gap=1))
        res = {(j.policy.name, j.cache): load_result(work, j) for j in jobs_by_trace[spec]}
        if any(v is None for v in res.values()):
            raise Incomplete(f"sensitivity runs of {sw.property} point {i} are not finished")
        for (p, c), r in res.items():
            if p == LADDER[0]:
                continue
            rows.append(
                {
                    "property": sw.property,
                    "point": i,
                    "knobs": dict(spec.knobs),
                    "value": props[sw.property],
                    "policy": p,
                    "cache": c,
                    "tpot_ms": r["tpot_ms"],
                    "gain": 1 - r["tpot_ms"] / res[(LADDER[0], c)]["tpot_ms"],
                    **{f"trace_{k}": v for k, v in props.items()},
                }
            )
    t = pd.DataFrame(rows)
    t.attrs["real"] = {
        name: trace_properties(compute_stats(Trace.open(shipped_trace_path(name)), max_gap=1))
        for name in REAL_TRACES
    }
    return t


def sensitivity_figure(sens: pd.DataFrame, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SWEEPS), figsize=(4.3 * len(SWEEPS), 3.4), squeeze=False)
    for ax, sw in zip(axes[0], SWEEPS):
        g = sens[sens.property == sw.property]
        for (p, c), h in g.groupby(["policy", "cache"], sort=False):
            h = h.sort_values("value")
            ax.plot(
                h.value,
                100 * h.gain,
                "o-" if c == 40 else "s--",
                ms=3,
                label={
                    "oled_priority": "+Priority",
                    "oled_priority_layeradapt": "+LayerAdapt",
                    "oled": "+Coop (OLED)",
                }.get(p, p)
                + f", Cache {c}",
            )
        for name, props in sens.attrs.get("real", {}).items():
            ax.axvline(props[sw.property], color="k", lw=0.8, ls=":")
        if sw.paper:
            ax.axvspan(*sw.paper, color="green", alpha=0.1, label="paper")
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_xlabel(sw.label + "\n(dotted: the real traces)", fontsize=8)
        ax.set_ylabel("TPOT reduction over Naive-LRU (%)", fontsize=8)
    axes[0, 0].legend(fontsize=6)
    fig.tight_layout()
    paths = atomic_savefig_png_pdf(fig, out / "sensitivity")
    plt.close(fig)
    return paths


def write_report(
    plan: Plan, work: Path, out: Path, command: str, sens_traces=None, sens_jobs=None, quick: bool = False
) -> list[Path]:
    """Every output of the reproduction into ``out``; raises :class:`Incomplete` where a run has no result."""
    runs = runs_table(plan, work)
    stats = trace_stats(plan, work)
    claims = claims_table(plan, runs, stats)
    sens = None
    if sens_traces:
        by_trace = {}
        for j in sens_jobs:
            by_trace.setdefault(j.trace, []).append(j)
        sens = sensitivity_table(work, sens_traces, by_trace)
    out.mkdir(parents=True, exist_ok=True)
    written = [
        atomic_write_text(out / "runs.csv", runs.to_csv(index=False)),
        atomic_write_text(
            out / "claims.csv",
            claims.assign(
                values=claims["values"].map(lambda v: "" if v is None else ";".join(f"{x:.6g}" for x in v))
            ).to_csv(index=False),
        ),
    ]
    written += ladder_figure(plan, claims, out)
    if sens is not None:
        written.append(atomic_write_text(out / "sensitivity.csv", sens.to_csv(index=False)))
        written += sensitivity_figure(sens, out)
    written.append(
        atomic_write_text(out / "REPRODUCTION.md", reproduction_md(plan, claims, sens, command, quick))
    )
    return written
