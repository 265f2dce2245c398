"""Predicted against measured, without a GPU: the metrics a validation compares, their relative error, a
simulation's prediction of them, the CPU path a replay measured, and the one-paragraph summary of a fidelity table.
The replay itself (which needs torch) is :mod:`dllm_offload_sim.validate.fidelity`; this module is what the report,
the re-prediction and the figure read."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dllm_offload_sim.schedule.summary import summarize as summarize_forwards
from dllm_offload_sim.sim.run import simulate
from dllm_offload_sim.validate.error_stats import error_stats

COUNTERS = ("hits", "demand_copies", "cpu_experts", "prefetch_copies")


def measured_cpu_path_s(forwards: pd.DataFrame, prefix: str = "") -> np.ndarray:
    """The CPU path each forward of a replay measured: the native engine's, on the GPU's clock (``cpu_path_s``),
    or where that is 0 the reference engine's worker's host times (waiting for its inputs, its jobs, its compute).
    ``prefix``: the columns' prefix (``measured_`` in a fidelity forwards table). Columns a table lacks count 0."""
    col = lambda c: (
        forwards[prefix + c].to_numpy(float) if prefix + c in forwards else np.zeros(len(forwards))
    )  # noqa: E731
    native = col("cpu_path_s")
    return np.where(native > 0, native, col("cpu_wait_x_s") + col("cpu_jobs_s") + col("cpu_compute_s"))


def predicted_metrics(sim) -> dict:
    """What a simulation predicts of a validated run: TPOT, the prefill (TTFT) forward and the counters."""
    return {
        "tpot_ms": sim.summary["tpot_ms"],
        "prefill_ms": summarize_forwards(sim.per_forward).prefill_ms,
        **{k: sim.summary[k] for k in COUNTERS},
    }


def relative_error(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured; 0 where both are 0, infinite where only the measurement is."""
    if measured:
        return (predicted - measured) / measured
    return 0.0 if predicted == measured else float("inf")


def simulate_as_replayed(trace, policy, cache: int, cost, requests, cpu_workers: int, loaded=None, **options):
    """A simulation of a validated run as the GPU replay runs it: the same requests and CPU workers, no warm-up batch
    (the replay starts cold); ``options`` go to :func:`~dllm_offload_sim.sim.run.simulate` (``decision_cost``,
    ``record_schedule``, ``record_layers``)."""
    return simulate(
        trace,
        policy,
        cache,
        cost,
        requests=requests,
        cpu_workers=cpu_workers,
        loaded=loaded,
        dummy_warmup=False,
        **options,
    )


def decision_us_per_layer(
    trace, make_policy, cache: int, cost, requests, cpu_workers: int = 1, loaded=None, decision_cost=None
) -> float:
    """A policy's decision time per MoE layer (us) on this machine, as a simulation of ``requests`` measures it:
    the second of two simulations, since the first compiles the policy's kernels (numba) and warms its caches,
    which would count as decision time."""
    for _ in range(2):
        sim = simulate_as_replayed(
            trace, make_policy(), cache, cost, requests, cpu_workers, loaded, decision_cost=decision_cost
        )
    return float(sim.summary["policy_us_per_layer"])


def summarize(table: pd.DataFrame) -> str:
    s = error_stats(table, "tpot_ms")
    lines = [
        f"TPOT: median |error| {100 * s['median']:.1f}%, max {100 * s['max']:.1f}% over {s['runs']} runs "
        f"(signed: {100 * s['signed_min']:+.1f}% .. {100 * s['signed_max']:+.1f}%)"
    ]
    p = error_stats(table, "prefill_ms")
    lines.append(
        f"prefill (TTFT forward): median |error| {100 * p['median']:.1f}%, max {100 * p['max']:.1f}%"
    )
    c = table[table.metric.isin(COUNTERS)]
    bad = c[c.predicted != c.measured]
    lines.append(
        "counters (hits, copies, CPU experts): "
        + (
            "all equal"
            if bad.empty
            else f"{len(bad)} differ: {bad[['policy', 'cache', 'metric']].values.tolist()}"
        )
    )
    return "\n".join(lines)
