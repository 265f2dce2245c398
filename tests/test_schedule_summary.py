"""One rule for TPOT and the prefill forward's time over a per-forward table (schedule.summary)."""

import math

import pandas as pd

from dllm_offload_sim.schedule.summary import summarize
from dllm_offload_sim.traces.schema import COMMIT, DENOISE, PREFILL


def test_tpot_is_decode_time_per_decoded_token_over_measured_forwards():
    pf = pd.DataFrame(
        {
            "phase": [PREFILL, DENOISE, COMMIT, PREFILL, DENOISE],
            "decoded": [0, 2, 1, 0, 5],
            "duration_s": [0.5, 0.02, 0.01, 0.7, 0.04],
            "measured": [True, True, True, False, False],  # a warm-up batch's forwards do not count
        }
    )
    s = summarize(pf)
    assert (s.forwards, s.decode_forwards, s.decoded_tokens) == (3, 2, 3)
    assert math.isclose(s.tpot_ms, 1e3 * 0.03 / 3) and math.isclose(s.prefill_ms, 500.0)


def test_a_table_without_measured_or_prefill_counts_every_forward():
    s = summarize(pd.DataFrame({"phase": [DENOISE, DENOISE], "decoded": [0, 0], "duration_s": [0.1, 0.1]}))
    assert s.forwards == 2 and math.isnan(s.tpot_ms) and math.isnan(s.prefill_ms)
