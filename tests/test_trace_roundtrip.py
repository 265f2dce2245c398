"""Trace format: write -> read gives back the same arrays; requests are read one at a time."""

import json

import pyarrow.parquet as pq
import pytest

from dllm_offload_sim.traces.errors import TraceError
from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.traces.schema import ROUTING_FILE
from dllm_offload_sim.traces.synth import SynthConfig, generate
from dllm_offload_sim.traces.topology import MINI
from dllm_offload_sim.traces.writer import write_trace

from tests.simkit import assert_same_request


def _reqs(n=2, seed=3):
    return list(
        generate(
            SynthConfig(n_requests=n, max_new_tokens=48, prompt_len_min=10, prompt_len_max=40, seed=seed)
        )
    )


def test_roundtrip_arrays_equal(tmp_path):
    reqs = _reqs()
    path = write_trace(tmp_path / "t", MINI, reqs, "synthetic", {"block_length": 16}, "unit")
    tr = Trace.open(path)
    assert tr.request_ids == [0, 1]
    for r in reqs:
        got = tr.request(r.request_id)
        assert_same_request(got, r)
        assert got.prompt_len == r.prompt_len


def test_one_row_group_per_request(tmp_path):
    path = write_trace(tmp_path / "t", MINI, _reqs(3), "synthetic", {"block_length": 16}, "unit")
    pf = pq.ParquetFile(path / ROUTING_FILE)
    assert pf.metadata.num_row_groups == 3
    tr = Trace.open(path)
    # reading request 1 touches exactly its own row group
    assert [g for g, _ in tr._idx[ROUTING_FILE].groups[1]] == [1]


def test_meta_fields(tmp_path):
    path = write_trace(
        tmp_path / "t", MINI, _reqs(1), "synthetic", {"block_length": 16, "threshold": 0.9}, "unit"
    )
    meta = json.loads((path / "meta.json").read_text())
    assert meta["schema_version"] == 1
    assert meta["model"]["expert_bytes"] == 6291456
    assert meta["n_requests"] == 1 and "prompt_hash" in meta["requests"][0]
    assert "prompt" not in json.dumps(meta["requests"]).replace("prompt_len", "").replace("prompt_hash", "")


def test_writer_refuses_existing_and_leaves_nothing_on_error(tmp_path):
    path = write_trace(tmp_path / "t", MINI, _reqs(1), "synthetic", {"block_length": 16}, "unit")
    before = (path / "meta.json").read_bytes()
    with pytest.raises(TraceError, match="already exists"):
        write_trace(path, MINI, _reqs(1), "synthetic", {"block_length": 16}, "unit")
    assert (path / "meta.json").read_bytes() == before

    def broken():
        yield _reqs(1)[0]
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        write_trace(tmp_path / "u", MINI, broken(), "synthetic", {"block_length": 16}, "unit")
    assert not (tmp_path / "u").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["t"]  # no partial temp dir left behind


def test_overwrite_replaces_only_when_complete(tmp_path):
    path = write_trace(tmp_path / "t", MINI, _reqs(1), "synthetic", {"block_length": 16}, "unit")

    def broken():
        raise RuntimeError("boom")
        yield

    with pytest.raises(RuntimeError):
        write_trace(path, MINI, broken(), "synthetic", {"block_length": 16}, "unit", overwrite=True)
    assert len(Trace.open(path)) == 1  # old trace intact
    write_trace(path, MINI, _reqs(2), "synthetic", {"block_length": 16}, "unit", overwrite=True)
    assert len(Trace.open(path)) == 2
