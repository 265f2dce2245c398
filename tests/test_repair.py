"""traces.repair: prompt rows carry NaN confidence, as the format says; the shipped traces follow it."""

from __future__ import annotations

import numpy as np
import pytest

from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.traces.repair import count_prompt_confidence, main, prompt_rows, repair_trace
from dllm_offload_sim.traces.shipped import SHIPPED_TRACES, resolve_trace


def test_the_shipped_traces_carry_no_prompt_confidence():
    for name in SHIPPED_TRACES:
        assert count_prompt_confidence(Trace.open(resolve_trace(name))) == 0, name


def test_repair_nulls_prompt_rows_only(tmp_path, small_trace):
    """A trace whose first decode block shares rows with the prompt: those rows' confidence becomes NaN, the
    generated rows' and every other column stay as they were."""
    import dataclasses

    from dllm_offload_sim.traces.subset import subset_trace

    tr = Trace.open(small_trace)
    bad = tmp_path / "bad"

    def with_prompt_conf(
        req,
    ):  # an older collector's output: the prompt ends 3 rows into the first decode block
        first = int(req.kv_len[req.decode_steps()[0]])
        req = dataclasses.replace(req, prompt_len=first + 3, confidence=req.confidence.copy())
        req.confidence[prompt_rows(req)] = 0.5
        return req

    subset_trace(small_trace, bad, tr.request_ids, transform=with_prompt_conf)
    before = Trace.open(bad)
    n = count_prompt_confidence(before)
    assert n > 0
    out, fixed = repair_trace(bad, tmp_path / "fixed")
    assert fixed == n and count_prompt_confidence(Trace.open(out)) == 0
    for rid in before.request_ids:
        a, b = before.request(rid), Trace.open(out).request(rid)
        keep = ~prompt_rows(a)
        np.testing.assert_array_equal(a.confidence[keep], b.confidence[keep])
        assert np.isnan(b.confidence[~keep]).all()
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.weights, b.weights)
    assert Trace.open(out).meta["extra"]["repair"] == {"prompt_rows_confidence_nulled": n}
    # in place: replaced once the repaired copy is complete
    assert main([str(bad), "--in-place"]) == 0 and count_prompt_confidence(Trace.open(bad)) == 0


@pytest.fixture
def small_trace(tmp_path):
    from dllm_offload_sim.traces.synth import SynthConfig, write_synthetic_trace

    return write_synthetic_trace(SynthConfig(n_requests=2, max_new_tokens=16, seed=1), tmp_path / "t")
