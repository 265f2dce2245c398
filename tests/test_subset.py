"""traces.subset: a trace cut to some requests keeps their records exactly and says where it came from."""

import json

import numpy as np
import pytest

from dllm_offload_sim.traces.errors import TraceError
from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.traces.shipped import SYNTHETIC_TRACE, shipped_trace_path
from dllm_offload_sim.traces.subset import main, subset_trace


def test_subset_keeps_requests_exactly(tmp_path):
    src = shipped_trace_path(SYNTHETIC_TRACE)
    out = subset_trace(src, tmp_path / "sub", [2, 0], extra={"why": "test"})
    a, b = Trace.open(src), Trace.open(out)
    b.validate()
    assert b.request_ids == [2, 0]
    assert b.meta["decoding"] == a.meta["decoding"] and b.meta["source"] == a.meta["source"]
    assert b.meta["extra"]["subset_of"]["request_ids"] == [2, 0] and b.meta["extra"]["why"] == "test"
    for rid in (0, 2):
        ra, rb = a.request(rid), b.request(rid)
        for name in (
            "phase",
            "row_offset",
            "ids",
            "weights",
            "confidence",
            "was_masked",
            "decoded",
            "kv_len",
        ):
            np.testing.assert_array_equal(getattr(ra, name), getattr(rb, name))
        assert ra.prompt_hash == rb.prompt_hash


def test_subset_unknown_request_is_a_clear_error(tmp_path):
    with pytest.raises(TraceError, match="no request_id 99"):
        subset_trace(shipped_trace_path(SYNTHETIC_TRACE), tmp_path / "x", [0, 99])
    assert not (tmp_path / "x").exists()


def test_subset_cli_first(tmp_path, capsys):
    assert (
        main([str(shipped_trace_path(SYNTHETIC_TRACE)), str(tmp_path / "f"), "--first", "2", "--note", "k=v"])
        == 0
    )
    meta = json.loads((tmp_path / "f" / "meta.json").read_text())
    assert [r["request_id"] for r in meta["requests"]] == [0, 1] and meta["extra"]["k"] == "v"
    assert main([str(tmp_path / "missing"), str(tmp_path / "g"), "--first", "1"]) == 2
    assert "no such trace directory" in capsys.readouterr().err
