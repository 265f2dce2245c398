"""TPOT and the prefill forward's time from a per-forward table: one rule for the simulator, the GPU replay and
the end-to-end mode, whose per-forward tables share the columns it reads."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from dllm_offload_sim.traces.schema import PREFILL


@dataclass(frozen=True)
class ForwardSummary:
    """Totals over a run's measured forwards (``measured`` true, or every forward of a table without the column)."""

    forwards: int  # measured forwards
    decode_forwards: int  # of them, those that are not prefill
    decoded_tokens: int  # tokens decoded by the decode forwards
    decode_time_s: float  # their summed duration
    tpot_ms: float  # decode_time_s per decoded token, in ms (NaN without a decoded token)
    prefill_ms: float  # the mean duration of the measured prefill forwards, in ms (NaN without one)


def summarize(per_forward: pd.DataFrame) -> ForwardSummary:
    """Reads the columns ``phase``, ``decoded``, ``duration_s`` and, where present, ``measured``."""
    meas = per_forward[per_forward.measured] if "measured" in per_forward else per_forward
    dec = meas[meas.phase != PREFILL]
    prefill = meas[meas.phase == PREFILL]
    decoded = int(dec.decoded.sum())
    decode_time = float(dec.duration_s.sum())
    return ForwardSummary(
        forwards=len(meas),
        decode_forwards=len(dec),
        decoded_tokens=decoded,
        decode_time_s=decode_time,
        tpot_ms=1e3 * decode_time / decoded if decoded else float("nan"),
        prefill_ms=1e3 * float(prefill.duration_s.mean()) if len(prefill) else float("nan"),
    )
