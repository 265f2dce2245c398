"""The per-layer timeline of a validated run: when each MoE layer's parts happen in the simulator and in the replay.

``dllm-validate validate.layer_timeline=true`` records, for every MoE layer the replay runs, the host's stamps
(routing on the host, the policy's answer, the CPU call submitted, the last GPU work issued, the layer's host work
done) and GPU-clock events (the layer's routing computed, its CPU path's start and end, its output complete), beside
the simulator's times for the same layer (``sim.engine.LayerTimes``: the modelled gate, CPU path end, GPU path end
and layer end). :func:`layer_timeline` joins the two per (forward, layer); :func:`timeline_table` condenses them
for ``dllm-report``: per run, the median over decode layers of a layer's span (its end after the previous layer's)
and of its parts, so that a run's TPOT error can be placed in one part of the layer; :func:`cpu_excess_table` sets
each CPU call's excess (the routing computed to the CPU path's end, measured minus predicted) against the GPU work the
simulator runs beside it, which tells a cost the CPU path pays per call while the GPU works (flat in the GPU work)
from one it pays per copy (growing with it); :func:`cooperative_parts_table` places each part of a layer that runs
both paths (its copies landed, its CPU experts computed, their result in the output, the layer's end) against the
previous layer's end, predicted and measured, so that a late layer end is traced to the copies, the CPU compute or the result's
wait behind the copies; :func:`copies_fit_table` fits when a layer's copies land against how many it copies, which
tells copies that start late from a copy engine that runs slow.
"""

from __future__ import annotations

import pandas as pd


def layer_timeline(
    predicted: pd.DataFrame, measured: pd.DataFrame, model: str, label: str, cache: int
) -> pd.DataFrame:
    """The simulator's and the replay's times of each MoE layer's parts side by side, one row per (forward, layer):
    ``predicted_*`` from ``sim.engine.LayerTimes``, ``measured_*`` from ``runtime.layer_stamps.LayerStamps``
    (seconds from the forward's start)."""
    p = predicted.rename(
        columns={c: f"predicted_{c}" for c in predicted.columns if c not in ("forward", "layer")}
    )
    m = measured.drop(columns=["to_gpu", "to_cpu"]).rename(
        columns={c: f"measured_{c}" for c in measured.columns if c not in ("forward", "layer")}
    )
    t = p.merge(m, on=["forward", "layer"], how="inner", validate="one_to_one")
    t.insert(0, "cache", int(cache))
    t.insert(0, "policy", label)
    t.insert(0, "model", model)
    return t


def _us(v: float) -> str:
    return "" if v != v else f"{round(1e6 * v) + 0:.0f}"  # + 0: a rounded -0.0 prints as 0


GPU_WORK_BINS_US = (0, 200, 400, 800, 1600, 3200, float("inf"))  # the GPU path beside a CPU call, predicted


def decode_layers(layers: pd.DataFrame, forwards: pd.DataFrame | None) -> pd.DataFrame:
    """``layers`` without the prefill forwards' (``forwards``, the per-forward table, says which they are; without it
    every forward counts), sorted by run, forward and layer."""
    from dllm_offload_sim.traces.schema import PREFILL

    t = layers.copy()
    key = ["model", "policy", "cache"]
    if forwards is not None and "phase" in forwards:
        ph = forwards[[c for c in (*key, "forward", "phase") if c in forwards]]
        t = t.merge(ph, on=[c for c in (*key, "forward") if c in ph], how="left")
        t = t[t.phase != PREFILL]
    return t.sort_values([*key, "forward", "layer"])


def previous_layers(t: pd.DataFrame) -> pd.DataFrame:
    """For each row of ``t`` (sorted as :func:`decode_layers` sorts), the row of the layer before it in the same run and
    forward (NaN for a forward's first layer)."""
    return t.groupby(["model", "policy", "cache", "forward"]).shift(1)


def after_previous_layers(layers: pd.DataFrame, forwards: pd.DataFrame | None) -> pd.DataFrame:
    """The decode layers (:func:`decode_layers`) that follow a layer of their forward with its end on both clocks, with
    that end as ``p0`` (predicted) and ``m0`` (measured, the GPU's clock): the one point the simulator and the replay
    place alike, from which the per-layer tables time a layer's parts."""
    t = decode_layers(layers, forwards)
    prev = previous_layers(t)
    t = t.assign(p0=prev.predicted_end_s, m0=prev.measured_gpu_end_s)
    return t[t.m0.notna() & t.p0.notna()]


def cpu_excess_table(layers: pd.DataFrame, forwards: pd.DataFrame | None = None) -> str:
    """Markdown: per run, its decode layers with a CPU call (and a layer before them in the forward) binned by the GPU
    path the simulator runs beside the call (from the layer's routing to the end of its GPU experts, predicted, us); per
    bin the layers and the median excess of the CPU path's end (from the previous layer's end, measured minus
    predicted, us). The previous layer's end is the point both sides place alike (:func:`cooperative_parts_table`).
    Runs without the GPU's clock (a CPU device) are left out; '' where no run has a timed CPU call."""
    t = after_previous_layers(layers, forwards)
    t = t[(t.predicted_to_cpu > 0) & t.measured_cpu_end_s.notna()]
    if t.empty:
        return ""
    t = t.assign(
        excess=(t.measured_cpu_end_s - t.m0) - (t.predicted_cpu_end_s - t.p0),
        gpu_us=1e6 * (t.predicted_gpu_end_s - t.predicted_gate_s).clip(lower=0),
    )
    edges = GPU_WORK_BINS_US
    names = [
        f"{a:.0f}-{b:.0f}" if b != float("inf") else f">= {a:.0f}" for a, b in zip(edges[:-1], edges[1:])
    ]
    t["bin"] = pd.cut(t.gpu_us, list(edges), right=False, labels=names)
    out = [
        "| policy | Cache | " + " | ".join(f"GPU work {n} us" for n in names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for (_, policy, cache), g in t.groupby(["model", "policy", "cache"], sort=False):
        cells = []
        for n in names:
            b = g[g.bin == n]
            cells.append(f"{_us(float(b.excess.median()))} ({len(b)})" if len(b) else "")
        out.append(f"| {policy} | {cache} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def timeline_table(layers: pd.DataFrame, forwards: pd.DataFrame | None = None) -> str:
    """Markdown: per run, medians over its decode forwards' MoE layers (all of them, and those with a CPU call) of
    the layer's span predicted / measured, and where the measured span goes (us). ``forwards`` (the per-forward
    table) says which forwards decode; without it every forward counts."""
    key = ["model", "policy", "cache"]
    t = decode_layers(layers, forwards)
    prev = previous_layers(t)
    t["p_span"] = t.predicted_end_s - prev.predicted_end_s
    t["m_span"] = t.measured_gpu_end_s - prev.measured_gpu_end_s
    t["m_host_span"] = t.measured_host_end_s - prev.measured_host_end_s  # without a GPU clock: the host's
    t["m_lead"] = t.measured_cpu_start_s - t.measured_gpu_gate_s
    t["m_cpu"] = t.measured_cpu_end_s - t.measured_cpu_start_s
    t["p_cpu"] = t.predicted_cpu_end_s - t.predicted_gate_s
    t["m_tail"] = t.measured_gpu_end_s - t.measured_cpu_end_s
    t["p_gpu"] = t.predicted_gpu_end_s - t.predicted_gate_s
    t["m_host_pre"] = t.measured_host_submitted_s - t.measured_host_ready_s
    t["m_host_issue"] = t.measured_host_issued_s - t.measured_host_ready_s
    out = [
        "| policy | Cache | layers (with a CPU call) | span predicted / measured us | with a CPU call: span predicted / "
        "measured us | routing computed to CPU path start us | CPU path predicted / measured us | CPU path end to "
        "layer end us | GPU path predicted us | host: routing to CPU call submitted / to last launch us |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for k, g in t.groupby(key, sort=False):
        c = g[g.predicted_to_cpu > 0]
        med = lambda d, col: float(d[col].median()) if len(d) else float("nan")  # noqa: E731
        m_span = med(g, "m_span") if g.m_span.notna().any() else med(g, "m_host_span")
        m_span_c = med(c, "m_span") if c.m_span.notna().any() else med(c, "m_host_span")
        out.append(
            f"| {k[1]} | {k[2]} | {len(g)} ({len(c)}) | {_us(med(g, 'p_span'))} / {_us(m_span)} | "
            f"{_us(med(c, 'p_span'))} / {_us(m_span_c)} | {_us(med(c, 'm_lead'))} | "
            f"{_us(med(c, 'p_cpu'))} / {_us(med(c, 'm_cpu'))} | {_us(med(c, 'm_tail'))} | {_us(med(g, 'p_gpu'))} | "
            f"{_us(med(c, 'm_host_pre'))} / {_us(med(g, 'm_host_issue'))} |"
        )
    return "\n".join(out) + "\n"


PARTS = (
    ("gate_s", "routing (simulated: decided)"),
    ("copies_end_s", "copies landed"),
    ("cpu_computed_s", "CPU experts computed"),
    ("cpu_end_s", "CPU result in the output"),
    ("end", "layer end"),
)


def cooperative_parts_table(layers: pd.DataFrame, forwards: pd.DataFrame | None = None) -> str:
    """Markdown: per run, its decode layers with both a CPU call and demand copies (and a layer before them in the
    forward); per part (:data:`PARTS`) the median time from the previous layer's end, predicted / measured (us), and
    the median of the measured minus predicted per layer. The previous layer's end is the one point both sides place
    alike: the simulator's gate comes after the policy's decision and the layer's fixed host costs, the replay's
    routing event before them. '' where no run recorded the parts (tables from before they were stamped, or a CPU
    device)."""
    need = {
        "measured_copies_end_s",
        "measured_cpu_computed_s",
        "predicted_copies_end_s",
        "predicted_cpu_computed_s",
    }
    if not need <= set(layers.columns):
        return ""
    t = after_previous_layers(layers, forwards)
    t = t[(t.predicted_to_cpu > 0) & (t.predicted_to_gpu > 0) & t.measured_copies_end_s.notna()]
    if t.empty:
        return ""
    for part, _ in PARTS:
        p = t.predicted_end_s if part == "end" else t[f"predicted_{part}"]
        m = {"end": t.measured_gpu_end_s, "gate_s": t.measured_gpu_gate_s}.get(part)
        m = t[f"measured_{part}"] if m is None else m
        t = t.assign(**{f"p_{part}": p - t.p0, f"m_{part}": m - t.m0})
    head = " | ".join(f"{name}: predicted / measured (excess) us" for _, name in PARTS)
    out = [f"| policy | Cache | layers | {head} |", "|---|---|---|" + "---|" * len(PARTS)]
    for (_, policy, cache), g in t.groupby(["model", "policy", "cache"], sort=False):
        cells = []
        for part, _ in PARTS:
            p, m = g[f"p_{part}"], g[f"m_{part}"]
            cells.append(
                f"{_us(float(p.median()))} / {_us(float(m.median()))} ({_us(float((m - p).median()))})"
            )
        out.append(f"| {policy} | {cache} | {len(g)} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def _line_fit(n: pd.Series, y: pd.Series) -> tuple[float, float]:
    """Least-squares (intercept, slope) of ``y`` against ``n``; the slope NaN where ``n`` does not vary."""
    import numpy as np

    x = n.to_numpy(float)
    if len(x) < 2 or np.ptp(x) == 0:
        return float(y.mean()), float("nan")
    slope, intercept = np.polyfit(x, y.to_numpy(float), 1)
    return float(intercept), float(slope)


def copies_fit_table(layers: pd.DataFrame, forwards: pd.DataFrame | None = None) -> str:
    """Markdown: per run, over its decode layers with demand copies (and a layer before them in the forward), a
    least-squares line of when the copies landed against the layer's copies: from the previous layer's end, predicted
    and measured (us + us per copy); from the host's stamp after the layer's last launch, measured (us per copy: the
    copy engine's rate, once the host has issued them); and the host's work from the routing to that last launch (us
    + us per copy). A measured slope above the predicted one with the rate after the last launch at the profile's
    says that host work growing with the layer's misses starts the copies late, not a slower copy engine. Runs
    without the GPU's clock are left out; '' where no run has timed copies."""
    need = {
        "measured_copies_end_s",
        "predicted_copies_end_s",
        "measured_host_issued_s",
        "measured_host_ready_s",
    }
    if not need <= set(layers.columns):
        return ""
    t = after_previous_layers(layers, forwards)
    t = t[(t.predicted_to_gpu > 0) & t.measured_copies_end_s.notna()]
    if t.empty:
        return ""
    out = [
        "| policy | Cache | layers | mean copies | copies landed, predicted: us + us/copy | measured | after the "
        "host's last launch: us/copy | host routing to last launch: us + us/copy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    line = lambda f: f"{_us(f[0])} + {1e6 * f[1]:.1f}"  # noqa: E731  (seconds in, us out)
    for (_, policy, cache), g in t.groupby(["model", "policy", "cache"], sort=False):
        n = g.predicted_to_gpu
        pred = _line_fit(n, g.predicted_copies_end_s - g.p0)
        meas = _line_fit(n, g.measured_copies_end_s - g.m0)
        rate = _line_fit(n, g.measured_copies_end_s - g.measured_host_issued_s)[1]
        host = _line_fit(n, g.measured_host_issued_s - g.measured_host_ready_s)
        out.append(
            f"| {policy} | {cache} | {len(g)} | {n.mean():.1f} | {line(pred)} | {line(meas)} | "
            f"{1e6 * rate:.1f} | {line(host)} |"
        )
    return "\n".join(out) + "\n"
