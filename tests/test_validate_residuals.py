"""The residual fit: a validation's decode-forward gaps as a cost per demand copy, per CPU expert and per forward."""

import math

import numpy as np
import pandas as pd
import pytest

from dllm_offload_sim.validate.residuals import residual_fit


def _forwards(copies, cpu, gap_of, prefill_gap=1.0):
    rows = [
        {"phase": 1, "to_gpu": c, "to_cpu": e, "predicted_s": 0.05, "measured_s": 0.05 + gap_of(c, e)}
        for c, e in zip(copies, cpu)
    ]
    rows.append({"phase": 0, "to_gpu": 500, "to_cpu": 0, "predicted_s": 0.5, "measured_s": 0.5 + prefill_gap})
    return pd.DataFrame(rows)


def test_the_fit_recovers_the_costs_the_model_missed_and_leaves_out_prefill():
    rng = np.random.default_rng(0)
    copies, cpu = rng.integers(0, 400, 60), rng.integers(0, 200, 60)
    fit = residual_fit(_forwards(copies, cpu, lambda c, e: 15e-6 * c - 18e-6 * e + 1.6e-3))
    assert fit.per_copy_s == pytest.approx(15e-6) and fit.per_cpu_expert_s == pytest.approx(-18e-6)
    assert fit.per_forward_s == pytest.approx(1.6e-3) and fit.forwards == 60 and fit.r2 == pytest.approx(1.0)
    assert (
        fit.describe()
        == "+15.0 us per demand copy, -18.0 us per CPU expert, +1.60 ms per forward (R² 1.00, 60 "
        "decode forwards)"
    )


def test_a_term_no_forward_has_is_left_out_and_too_few_forwards_give_no_fit():
    fit = residual_fit(_forwards([10, 20, 30, 40], [0, 0, 0, 0], lambda c, e: 2e-6 * c))
    assert math.isnan(fit.per_cpu_expert_s) and fit.per_copy_s == pytest.approx(2e-6)
    assert "per CPU expert" not in fit.describe()
    assert residual_fit(_forwards([10, 20], [1, 2], lambda c, e: 0.0)) is None
