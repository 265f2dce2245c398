"""The replay's host steps per MoE layer beside what the profile charges for them.

The simulator charges a MoE layer's own host work as the profile measured it: the bookkeeping from the routing to the
first expert work (``runtime.bookkeeping_s``, per layer), a grouped call's issue (``grouped_issue_s``, per call) and a
CPU call's submission (``cpu_issue_s``, per call), and the first two beside the CPU engine where the profile measured
them (``bookkeeping_cpu_s``, ``grouped_issue_cpu_s``). A validation run measures the same steps in its replay, forward by
forward. This sets the two side by side per run, with the issue of each demand copy and the part of a decode
forward's gap (measured minus predicted time) that its CPU path does not explain: a run whose host did more than the
profile says shows where.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dllm_offload_sim.validate.comparison import measured_cpu_path_s


def host_steps(forwards: pd.DataFrame, n_moe_layers: int) -> pd.DataFrame:
    """One row per run (model where there is one, policy, cache) over its decode forwards: the bookkeeping and the CPU
    call's issue per MoE layer, a grouped call's issue and a demand copy's issue (us; NaN where the run made none),
    and the mean gap of a decode forward beyond its CPU path's (ms: measured minus predicted time, less measured minus
    predicted CPU path). ValueError where the table predates the replay's host stamps."""
    from dllm_offload_sim.traces.schema import PREFILL

    need = (
        "measured_bookkeeping_s",
        "measured_grouped_issue_s",
        "measured_grouped_calls",
        "measured_cpu_issue_s",
        "measured_copy_issue_s",
    )
    missing = [c for c in need if c not in forwards]
    if missing:
        raise ValueError(
            f"host_steps: the per-forward table has no {', '.join(missing)} (validated before the replay "
            f"stamped its host steps)"
        )
    dec = forwards[forwards.phase != PREFILL]
    key = [k for k in ("model", "policy", "cache") if k in dec]
    per = lambda num, den: 1e6 * num / den if den > 0 else float("nan")  # noqa: E731
    rows = []
    for k, g in dec.groupby(key, sort=False, dropna=False):
        layers = len(g) * n_moe_layers
        gap = (g.measured_s - g.predicted_s) - (measured_cpu_path_s(g, "measured_") - g.predicted_cpu_path_s)
        total = lambda c: float(g[c].sum())  # noqa: E731
        rows.append(
            {
                **dict(zip(key, k)),
                "bookkeeping_us": per(total("measured_bookkeeping_s"), layers),
                "grouped_issue_us": per(total("measured_grouped_issue_s"), total("measured_grouped_calls")),
                "cpu_issue_us": per(total("measured_cpu_issue_s"), layers)
                if total("to_cpu")
                else float("nan"),
                "copy_issue_us": per(total("measured_copy_issue_s"), total("to_gpu")),
                "gap_beyond_cpu_ms": 1e3 * float(np.mean(gap)),
            }
        )
    return pd.DataFrame(rows)


def _us(v) -> str:
    return "" if v != v else f"{v:.0f}"


def host_steps_table(forwards: pd.DataFrame, profile) -> str:
    """:func:`host_steps` of every run as Markdown, under a first row with what ``profile`` (a
    :class:`~dllm_offload_sim.costmodel.profile.HardwareProfile`) charges for the same steps; ValueError where the
    profile does not say how many MoE layers its model has (``model_shape.n_moe_layers``)."""
    if "n_moe_layers" not in (profile.model_shape or {}):
        raise ValueError(
            f"profile {profile.path or profile.name}: model_shape.n_moe_layers absent (the MoE layers the "
            f"host steps are counted over)"
        )
    n_layers = int(profile.model_shape["n_moe_layers"])
    steps = host_steps(forwards, n_layers)
    rt = profile.runtime or {}
    charge = {
        t: 1e6 * float(rt[t]) if t in rt else float("nan")
        for t in (
            "bookkeeping_s",
            "grouped_issue_s",
            "cpu_issue_s",
            "bookkeeping_cpu_s",
            "grouped_issue_cpu_s",
        )
    }
    out = [
        "| policy | Cache | bookkeeping us per MoE layer | a grouped call's issue us | the CPU call's issue us per "
        "MoE layer | a demand copy's issue us | gap beyond the CPU path ms per decode forward |",
        "|---|---|---|---|---|---|---|",
        f"| the profile's charge | | {_us(charge['bookkeeping_s'])} | {_us(charge['grouped_issue_s'])} | "
        f"{_us(charge['cpu_issue_s'])} (per call) | | |",
    ]
    if charge["bookkeeping_cpu_s"] == charge["bookkeeping_cpu_s"]:
        out.append(
            f"| the profile's charge beside the CPU engine | | {_us(charge['bookkeeping_cpu_s'])} (after a "
            f"layer with a CPU call) | {_us(charge['grouped_issue_cpu_s'])} (in a layer with a CPU call) | | | |"
        )
    several = "model" in steps and steps["model"].nunique() > 1
    for r in steps.itertuples(index=False):
        name = f"{r.policy} ({str(r.model).removeprefix('llada2-')})" if several else r.policy
        copy = "" if r.copy_issue_us != r.copy_issue_us else f"{r.copy_issue_us:.1f}"
        out.append(
            f"| {name} | {r.cache} | {_us(r.bookkeeping_us)} | {_us(r.grouped_issue_us)} | "
            f"{_us(r.cpu_issue_us)} | {copy} | {r.gap_beyond_cpu_ms:+.2f} |"
        )
    return "\n".join(out) + "\n"
