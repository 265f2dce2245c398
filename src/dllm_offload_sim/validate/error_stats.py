"""The one summary of a fidelity table's errors that the validator's CLI, report and figure print."""

from __future__ import annotations

import pandas as pd


def error_stats(table: pd.DataFrame, metric: str = "tpot_ms") -> dict:
    """|relative error| of ``metric`` over a fidelity table's runs: median, max, how many within 5% and
    10%, and the signed range (the one summary the CLI, the report and the figure print)."""
    t = table[table.metric == metric]
    e = (t.predicted - t.measured).abs() / t.measured
    signed = (t.predicted - t.measured) / t.measured
    return {
        "runs": len(t),
        "median": float(e.median()),
        "max": float(e.max()),
        "within_5": int((e <= 0.05).sum()),
        "within_10": int((e <= 0.10).sum()),
        "signed_min": float(signed.min()),
        "signed_max": float(signed.max()),
    }
