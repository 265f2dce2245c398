"""Which component a validation's time gap belongs to: the measured minus predicted time of every decode forward,
fitted by least squares as a cost per demand copy, a cost per CPU expert and a cost per forward the model missed.

A gap that grows with the copies points at the copy model (the H2D curve, or how copies are issued), one that grows
with the CPU experts at the CPU curve, and a fixed one per forward at the per-layer host terms. The fit runs over the
forwards of several runs at once (other policies and caches), which is what separates the three.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dllm_offload_sim.traces.schema import PREFILL

TERMS = (("to_gpu", "per demand copy"), ("to_cpu", "per CPU expert"))


@dataclass(frozen=True)
class ResidualFit:
    """Seconds the model missed per demand copy, per CPU expert and per forward (NaN for a term no forward has),
    over ``forwards`` decode forwards, and the share of the gap's variance the fit explains (``r2``)."""

    per_copy_s: float
    per_cpu_expert_s: float
    per_forward_s: float
    forwards: int
    r2: float

    def describe(self) -> str:
        """One line, e.g. ``+15.0 us per demand copy, -18.4 us per CPU expert, +1.61 ms per forward (R² 0.62, 1179
        decode forwards)``."""
        parts = [
            f"{v * 1e6:+.1f} us {name}"
            for v, (_, name) in zip((self.per_copy_s, self.per_cpu_expert_s), TERMS)
            if not math.isnan(v)
        ]
        return (
            ", ".join(parts + [f"{self.per_forward_s * 1e3:+.2f} ms per forward"])
            + f" (R² {self.r2:.2f}, {self.forwards} decode forwards)"
        )


def residual_fit(forwards: pd.DataFrame) -> ResidualFit | None:
    """The fit over the decode forwards of ``forwards`` (a validation's per-forward table: ``measured_s``,
    ``predicted_s``, ``to_gpu``, ``to_cpu``, ``phase``); None with fewer forwards than terms to fit."""
    dec = forwards[forwards.phase != PREFILL]
    gap = (dec.measured_s - dec.predicted_s).to_numpy(float)
    cols = [c for c, _ in TERMS if c in dec and dec[c].to_numpy().any()]
    if len(dec) <= len(cols) + 1:
        return None
    X = np.column_stack([dec[c].to_numpy(float) for c in cols] + [np.ones(len(dec))])
    coef = np.linalg.lstsq(X, gap, rcond=None)[0]
    ss_tot = float(((gap - gap.mean()) ** 2).sum())
    r2 = 1.0 - float(((gap - X @ coef) ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0
    got = dict(zip(cols, coef[:-1]))
    return ResidualFit(
        float(got.get("to_gpu", math.nan)), float(got.get("to_cpu", math.nan)), float(coef[-1]), len(dec), r2
    )
