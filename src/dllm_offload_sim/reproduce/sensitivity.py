"""Trace-property sensitivity: what each OLED rung gains over Naive-LRU as one property OLED relies on moves.

Each sweep moves synthetic-generator knobs (:class:`traces.synth.SynthConfig`) from the paper-calibrated defaults and
measures the property on the trace it makes (:func:`traces.analytics.compute_stats`), so the x-axis is the
property as measured, not the knob:

* ``adjacent_overlap``: how far token latents drift between iterations, every stability knob's distance from 1
  scaled together (``drift``);
* ``boundary_overlap``: how much of a block's routing context and token latents the next block inherits
  (``block_carry`` = ``token_carry``);
* ``conf_stability_corr``: the confidence-to-stability slope, ``stability_high - stability_low`` around their mean,
  from inverted (low-confidence tokens the more stable) to the default's strong positive slope;
* ``layer_heterogeneity``: the spread of expert popularity across layers (``layer_skew_min``/``_max`` around their
  mean), measured as the coefficient of variation of the layers' activation ratios.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dllm_offload_sim.reproduce.setups import LADDER, HardwareSpec, Job, PolicySpec, TraceSpec
from dllm_offload_sim.traces.synth import SynthConfig

DEFAULT = SynthConfig()
SENSITIVITY_CACHES = (40, 100)


@dataclass(frozen=True)
class Sweep:
    """One property and the knob settings that move it."""

    property: str  # the measured property (a key of trace_properties)
    label: str
    points: tuple  # per point: (knob, value) pairs
    # the paper's stated value or band of the property (None: not stated as a number)
    paper: tuple | None = None


def _drift(d: float) -> tuple:
    return tuple(
        (k, round(1 - d * (1 - getattr(DEFAULT, k)), 6))
        for k in ("stability_low", "stability_high", "stability_decoded")
    )


def _around(lo_key: str, hi_key: str, mean: float, spread: float) -> tuple:
    return ((lo_key, round(mean - spread / 2, 6)), (hi_key, round(mean + spread / 2, 6)))


SWEEPS = (
    Sweep(
        "adjacent_overlap",
        "adjacent-iteration overlap",
        tuple(_drift(d) for d in (0.25, 0.5, 1.0, 2.0, 3.5)),
        paper=(0.85, 0.90),
    ),
    Sweep(
        "boundary_overlap",
        "block-boundary overlap",
        tuple((("block_carry", c), ("token_carry", c)) for c in (0.0, 0.3, 0.6, 0.8, 0.95)),
        paper=(0.65, 1.0),
    ),
    Sweep(
        "conf_stability_corr",
        "confidence-stability correlation",
        tuple(_around("stability_low", "stability_high", 0.87, s) for s in (-0.24, -0.12, 0.0, 0.12, 0.24)),
    ),
    Sweep(
        "layer_heterogeneity",
        "layer heterogeneity (CV of activation ratios)",
        tuple(_around("layer_skew_min", "layer_skew_max", 0.85, w) for w in (0.0, 0.4, 0.8, 1.3, 1.7)),
    ),
)


def trace_properties(stats) -> dict:
    """The four swept properties of a trace, from its :class:`traces.analytics.TraceStats`."""
    ratio = np.asarray(stats.layers.activation_ratio, float)
    return {
        "adjacent_overlap": float(stats.summary["adjacent_overlap"]),
        "boundary_overlap": float(stats.summary["boundary_overlap"]),
        "conf_stability_corr": float(stats.summary["conf_stability_corr"]),
        "layer_heterogeneity": float(ratio.std() / ratio.mean())
        if ratio.size and ratio.mean() > 0
        else np.nan,
    }


def sweep_traces(
    new_tokens: int = 512, n_requests: int = 2, points=None
) -> list[tuple[Sweep, int, TraceSpec]]:
    """Every (sweep, point, trace) of the sensitivity study (mini shape); ``points``: the indices of each sweep's
    points to keep (None: all)."""
    return [
        (sw, i, TraceSpec("paper", "mini", new_tokens, n_requests, seed=3, knobs=knobs))
        for sw in SWEEPS
        for i, knobs in enumerate(sw.points)
        if points is None or i in points
    ]


def sweep_jobs(traces, hardware: HardwareSpec = HardwareSpec("h100"), caches=SENSITIVITY_CACHES) -> list[Job]:
    """Naive-LRU and the OLED rungs (as the project reads OLED) at each cache on each trace, warmed up."""
    return [Job(tr, hardware, PolicySpec(p), c, True) for _, _, tr in traces for p in LADDER for c in caches]
