"""The routing interchange format and dllm-trace-import: a trace written out row by row comes back identical, an
autoregressive log needs no forward fields, the SGLang-style example converts a dump, and every bad line is named."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dllm_offload_sim.traces.errors import TraceError
from dllm_offload_sim.traces.interchange import (
    InterchangeHeader,
    InterchangeWriter,
    import_trace,
    read_interchange,
)
from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.traces.schema import PHASES
from dllm_offload_sim.traces.synth import SynthConfig, write_synthetic_trace

from tests.simkit import assert_same_request, script_module


def _export(trace: Trace, path, decoding="block-diffusion") -> None:
    """Every routed row of ``trace`` written in the interchange format, forward fields and confidence included."""
    topo = trace.topology
    with InterchangeWriter(path, InterchangeHeader("mini", decoding, trace.block_length, "synthetic")) as w:
        for rid in trace.request_ids:
            r = trace.request(rid)
            for s in range(r.n_steps):
                fwd = dict(
                    phase=PHASES[r.phase[s]],
                    kv_len=int(r.kv_len[s]),
                    n_decoded=int(r.n_decoded[s]),
                    block=int(r.block[s]),
                    step_in_block=int(r.step_in_block[s]),
                )
                for t, n in enumerate(range(*r.rows(s).indices(int(r.row_offset[-1])))):
                    extra = {} if np.isnan(r.confidence[n]) else {"confidence": float(r.confidence[n])}
                    for j, layer in enumerate(topo.moe_layers):
                        w.row(
                            rid,
                            s,
                            layer,
                            t,
                            r.ids[n, j],
                            r.weights[n, j],
                            was_masked=bool(r.was_masked[n]),
                            decoded=bool(r.decoded[n]),
                            **fwd,
                            **extra,
                        )


def test_a_trace_written_to_the_interchange_format_imports_back_identical(tmp_path):
    src = Trace.open(
        write_synthetic_trace(SynthConfig(n_requests=2, max_new_tokens=32, seed=3), str(tmp_path / "s"))
    )
    _export(src, tmp_path / "r.jsonl")
    back = Trace.open(import_trace(tmp_path / "r.jsonl", tmp_path / "t"))
    assert back.request_ids == src.request_ids and back.topology == src.topology
    for rid in src.request_ids:
        assert_same_request(back.request(rid), src.request(rid))


def test_an_autoregressive_log_needs_only_routing_and_the_sglang_example_converts_a_dump(tmp_path):
    ex = script_module("examples/sglang_routed_experts.py")
    ex.demo_dump(str(tmp_path / "dump.jsonl"), requests=2)
    assert ex.convert(str(tmp_path / "dump.jsonl"), "qwen3-30b-a3b", str(tmp_path / "r.jsonl")) == 2 * 35 * 48
    trace = Trace.open(import_trace(tmp_path / "r.jsonl", tmp_path / "t"))
    r = trace.request(0)
    assert trace.topology.name == "qwen3-30b-a3b" and r.n_steps == 24  # the prefill, then 23 decode steps
    assert list(r.n_tokens[:3]) == [12, 1, 1] and list(r.kv_len[:3]) == [0, 12, 13]
    assert list(r.n_decoded[:3]) == [0, 1, 1] and r.prompt_len == 12
    assert np.allclose(r.weights, 1 / 8) and trace.meta["extra"]["gate_weights"].startswith("uniform")


def _log(tmp_path, lines, header=None):
    h = header or {
        "format": "dllm-routing",
        "version": 1,
        "model": "olmoe-1b-7b",
        "decoding": "autoregressive",
        "block_length": 1,
    }
    f = tmp_path / "bad.jsonl"
    f.write_text("\n".join([json.dumps(h)] + [json.dumps(x) for x in lines]) + "\n")
    return f


ROW = {"request": 0, "forward": 0, "layer": 0, "token": 0, "experts": [0, 1, 2, 3, 4, 5, 6, 7]}


@pytest.mark.parametrize(
    "lines, header, message",
    [
        ([ROW], {"format": "other"}, r"line 1: the header must hold \"format\": \"dllm-routing\""),
        ([ROW], {"format": "dllm-routing", "version": 2}, r"line 1, field 'version': 2"),
        ([{**ROW, "expert": 1}], None, r"line 2: unknown field 'expert'"),
        ([{**ROW, "layer": 16}], None, r"line 2, field 'layer': 16 is not a MoE layer of olmoe-1b-7b"),
        ([{**ROW, "experts": [1, 2]}], None, r"line 2, field 'experts': expected 8 ids"),
        (
            [{**ROW, "experts": [0, 0, 2, 3, 4, 5, 6, 7]}],
            None,
            r"line 2, field 'experts': an expert appears twice",
        ),
        (
            [{**ROW, "experts": [64, 1, 2, 3, 4, 5, 6, 7]}],
            None,
            r"line 2, field 'experts': ids must be integers in 0..63",
        ),
        (
            [ROW, ROW],
            None,
            r"line 3: request 0, forward 0, layer 0, token 0 appears twice \(first on line 2\)",
        ),
        ([ROW], None, r"request 0, forward 0: no row for layer 1, token 0"),
        (
            [{**ROW, "weights": [0.1] * 8}, {**ROW, "layer": 1}],
            None,
            r"line 3, field 'weights': give weights on every",
        ),
    ],
)
def test_a_bad_line_is_named_with_its_file_line_and_field(tmp_path, lines, header, message):
    f = _log(tmp_path, lines, header)
    with pytest.raises(TraceError, match=message) as e:
        read_interchange(f)
    assert str(e.value).startswith(str(f))


def test_a_block_diffusion_log_must_give_its_forward_fields(tmp_path):
    header = {
        "format": "dllm-routing",
        "version": 1,
        "model": "olmoe-1b-7b",
        "decoding": "block-diffusion",
        "block_length": 16,
    }
    rows = [{**ROW, "layer": layer} for layer in range(16)]
    with pytest.raises(TraceError, match=r"line 2: a block-diffusion log gives 'phase' for every forward"):
        read_interchange(_log(tmp_path, rows, header))
