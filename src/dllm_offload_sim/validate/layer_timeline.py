"""The per-layer timeline of a validated run: when each MoE layer's parts happen in the simulator and in the replay.

``dllm-validate validate.layer_timeline=true`` records, for every MoE layer the replay runs, the host's stamps
(routing on the host, the policy's answer, the CPU call submitted, the last GPU work issued, the layer's host work
done) and GPU-clock events (the layer's routing computed, its CPU path's start and end, its output complete), beside
the simulator's times for the same layer (``sim.engine.LayerTimes``: the modelled gate, CPU path end, GPU path end
and layer end). :func:`layer_timeline` joins the two per (forward, layer); :func:`timeline_table` condenses them
for ``dllm-report``: per run, the median over decode layers of a layer's span (its end after the previous layer's)
and of its parts, so that a run's TPOT error can be placed in one part of the layer.
"""

from __future__ import annotations

import pandas as pd


def layer_timeline(predicted: pd.DataFrame, measured: pd.DataFrame, model: str, label: str, cache: int) -> pd.DataFrame:
    """The simulator's and the replay's times of each MoE layer's parts side by side, one row per (forward, layer):
    ``predicted_*`` from ``sim.engine.LayerTimes``, ``measured_*`` from ``runtime.replay.LayerStamps`` (seconds from
    the forward's start)."""
    p = predicted.rename(columns={c: f"predicted_{c}" for c in predicted.columns if c not in ("forward", "layer")})
    m = measured.drop(columns=["to_gpu", "to_cpu"]).rename(
        columns={c: f"measured_{c}" for c in measured.columns if c not in ("forward", "layer")})
    t = p.merge(m, on=["forward", "layer"], how="inner", validate="one_to_one")
    t.insert(0, "cache", int(cache))
    t.insert(0, "policy", label)
    t.insert(0, "model", model)
    return t


def _us(v: float) -> str:
    return "" if v != v else f"{1e6 * v:.0f}"


def timeline_table(layers: pd.DataFrame, forwards: pd.DataFrame | None = None) -> str:
    """Markdown: per run, medians over its decode forwards' MoE layers (all of them, and those with a CPU call) of
    the layer's span predicted / measured, and where the measured span goes (us). ``forwards`` (the per-forward
    table) says which forwards decode; without it every forward counts."""
    from dllm_offload_sim.traces.schema import PREFILL

    t = layers.copy()
    key = ["model", "policy", "cache"]
    if forwards is not None and "phase" in forwards:
        ph = forwards[[c for c in (*key, "forward", "phase") if c in forwards]]
        t = t.merge(ph, on=[c for c in (*key, "forward") if c in ph], how="left")
        t = t[t.phase != PREFILL]
    t = t.sort_values([*key, "forward", "layer"])
    prev = t.groupby([*key, "forward"]).shift(1)  # the layer before, in the same forward
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
    out = ["| policy | Cache | layers (with a CPU call) | span predicted / measured us | with a CPU call: span predicted / "
           "measured us | routing computed to CPU path start us | CPU path predicted / measured us | CPU path end to "
           "layer end us | GPU path predicted us | host: routing to CPU call submitted / to last launch us |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for k, g in t.groupby(key, sort=False):
        c = g[g.predicted_to_cpu > 0]
        med = lambda d, col: float(d[col].median()) if len(d) else float("nan")  # noqa: E731
        m_span = med(g, "m_span") if g.m_span.notna().any() else med(g, "m_host_span")
        m_span_c = med(c, "m_span") if c.m_span.notna().any() else med(c, "m_host_span")
        out.append(f"| {k[1]} | {k[2]} | {len(g)} ({len(c)}) | {_us(med(g, 'p_span'))} / {_us(m_span)} | "
                   f"{_us(med(c, 'p_span'))} / {_us(m_span_c)} | {_us(med(c, 'm_lead'))} | "
                   f"{_us(med(c, 'p_cpu'))} / {_us(med(c, 'm_cpu'))} | {_us(med(c, 'm_tail'))} | {_us(med(g, 'p_gpu'))} | "
                   f"{_us(med(c, 'm_host_pre'))} / {_us(med(g, 'm_host_issue'))} |")
    return "\n".join(out) + "\n"
