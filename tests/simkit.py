"""Helpers for simulator tests: tiny topologies, hand-made profiles and traces, and the repository's scripts as
modules."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

from dllm_offload_sim.costmodel.cost_model import CostModel
from dllm_offload_sim.costmodel.profile import HardwareProfile
from dllm_offload_sim.traces.schema import COMMIT, DENOISE, PREFILL, RequestArrays
from dllm_offload_sim.traces.topology import ModelTopology
from dllm_offload_sim.traces.writer import write_trace


def tiny_topology(n_moe: int = 1, n_experts: int = 8, top_k: int = 2) -> ModelTopology:
    """Layer 0 dense, then ``n_moe`` MoE layers of ``n_experts`` experts (one group)."""
    return ModelTopology(
        name="tiny",
        n_layers=n_moe + 1,
        moe_layers=tuple(range(1, n_moe + 1)),
        n_experts=n_experts,
        top_k=top_k,
        n_group=1,
        topk_group=1,
        hidden=64,
        moe_intermediate=32,
        vocab_size=100,
        n_heads=2,
        n_kv_heads=1,
        head_dim=32,
        dense_intermediate=64,
    )


def flat_profile(
    topo: ModelTopology,
    h2d_s: float = 10e-3,
    gpu_s: float = 1e-3,
    cpu_per_token_s: float = 2e-3,
    ne_s: float = 1e-3,
    dense_s: float = 0.5e-3,
    fwd_s: float = 0.5e-3,
    dispatch_s: float = 0.0,
    h2d_latency_s: float = 0.0,
    gpu_device_s: float | None = None,
    cpu_call_overhead_s: float | None = None,
) -> HardwareProfile:
    """Round-number costs for hand-computed timelines: each curve is flat (or linear for the CPU).
    ``gpu_device_s`` adds a (flat) kernels-only grouped curve, ``cpu_call_overhead_s`` a CPU call cost."""
    eb = topo.expert_bytes
    bw = eb / (h2d_s - h2d_latency_s)
    toks = [1, 1024]
    return HardwareProfile(
        name="flat-test",
        status="estimated",
        stamp={
            "gpu": "test",
            "driver": "-",
            "cuda": "-",
            "torch": "-",
            "cpu_model": "-",
            "cpu_threads": 1,
            "dtype": "bf16",
        },
        model_shape={
            "name": topo.name,
            "hidden": topo.hidden,
            "moe_intermediate": topo.moe_intermediate,
            "expert_bytes": eb,
        },
        h2d={"bytes": [eb, 2 * eb], "seconds": [h2d_latency_s + eb / bw, h2d_latency_s + 2 * eb / bw]},
        curves={
            "gpu_experts": {
                "experts": [1, 256],
                "tokens_per_expert": toks,
                "seconds": [[gpu_s, gpu_s], [gpu_s, gpu_s]],
            },
            "cpu_expert": {
                "tokens": toks,
                "seconds": [cpu_per_token_s * t for t in toks],
                **({"call_overhead_s": cpu_call_overhead_s} if cpu_call_overhead_s is not None else {}),
            },
            **(
                {
                    "gpu_experts_device": {
                        "experts": [1, 256],
                        "tokens_per_expert": toks,
                        "seconds": [[gpu_device_s] * 2] * 2,
                    }
                }
                if gpu_device_s is not None
                else {}
            ),
            "cpu_dispatch": {"tokens": toks, "seconds": [dispatch_s, dispatch_s]},
            "non_expert": {"tokens": toks, "kv_len": [0, 1024], "seconds": [[ne_s, ne_s], [ne_s, ne_s]]},
            "dense_layer": {
                "tokens": toks,
                "kv_len": [0, 1024],
                "seconds": [[dense_s, dense_s], [dense_s, dense_s]],
            },
            "per_forward": {"tokens": toks, "seconds": [fwd_s, fwd_s]},
        },
    )


def flat_cost(topo, **kw) -> CostModel:
    return CostModel(flat_profile(topo, **kw))


def request_from_routing(
    rid: int,
    forwards: list[list[list[list[int]]]],
    decoded: list[int] | None = None,
    phases: list[int] | None = None,
    confidence: list[list[float]] | None = None,
    block_of: list[int] | None = None,
) -> RequestArrays:
    """A request from explicit routing: ``forwards[s][row][layer] = [expert ids]``.

    Forward 0 is the prefill unless ``phases`` says otherwise; each decode forward decodes
    ``decoded[s]`` tokens (default 1).
    """
    S = len(forwards)
    phases = phases or [PREFILL] + [DENOISE] * (S - 1)
    decoded = decoded or [0 if p == PREFILL else 1 for p in phases]
    n_tok = [len(f) for f in forwards]
    off = np.zeros(S + 1, np.int64)
    np.cumsum(n_tok, out=off[1:])
    ids = np.array([row for f in forwards for row in f], np.int16)
    N = int(off[-1])
    conf = np.full(N, np.nan, np.float32)
    if confidence:
        conf = np.concatenate([np.asarray(c, np.float32) for c in confidence])
    blocks = block_of or [0] + [1] * (S - 1)
    sib = []
    for s in range(S):
        sib.append(0 if s == 0 or blocks[s] != blocks[s - 1] else sib[-1] + 1)
    return RequestArrays(
        request_id=rid,
        phase=np.array(phases, np.int8),
        block=np.array(blocks, np.int32),
        step_in_block=np.array(sib, np.int32),
        kv_len=np.zeros(S, np.int32),
        n_decoded=np.array(decoded, np.int32),
        row_offset=off,
        ids=ids,
        weights=np.full(ids.shape, 0.5, np.float32),
        confidence=conf,
        was_masked=np.zeros(N, bool),
        decoded=_decoded_rows(off, decoded),
    )


def _decoded_rows(off: np.ndarray, decoded: list[int]) -> np.ndarray:
    """Row flags agreeing with each step's ``n_decoded`` (a reader refuses tables that disagree): the step's first
    ``decoded[s]`` rows."""
    out = np.zeros(int(off[-1]), bool)
    for s, n in enumerate(decoded):
        if n > off[s + 1] - off[s]:
            raise ValueError(f"step {s} decodes {n} tokens but has {off[s + 1] - off[s]} rows")
        out[off[s] : off[s] + n] = True
    return out


def random_request(
    rng: np.random.Generator, rid: int, topo: ModelTopology, n_forwards: int, rows: int, block_len: int = 4
) -> RequestArrays:
    """Random routing (distinct experts per row), blocks of ``block_len`` decode forwards."""
    L, E, k = topo.n_moe_layers, topo.n_experts, topo.top_k
    fw = []
    for s in range(n_forwards):
        fw.append([[rng.choice(E, k, replace=False).tolist() for _ in range(L)] for _ in range(rows)])
    blocks = [0] + [1 + (s - 1) // block_len for s in range(1, n_forwards)]
    phases = [PREFILL] + [COMMIT if (s % block_len == 0) else DENOISE for s in range(1, n_forwards)]
    decoded = [0] + [0 if p == COMMIT else min(rows, int(rng.integers(1, 3))) for p in phases[1:]]
    conf = [rng.random(rows).tolist() for _ in range(n_forwards)]
    r = request_from_routing(rid, fw, decoded=decoded, phases=phases, confidence=conf, block_of=blocks)
    r.weights = rng.random(r.ids.shape).astype(np.float32)
    return r


def write_requests(path, topo, reqs, block_length: int = 4):
    return write_trace(path, topo, reqs, "synthetic", {"block_length": block_length}, "unit-test")


REPO = Path(__file__).parents[1]


def script_module(relpath: str):
    """A script of the repository that is not part of the package (``bench/bench_sim.py``, ``notebooks/figures.py``)
    loaded as a module, so that a test calls its functions."""
    path = REPO / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # as an import does: dataclasses and pickle look the module up there
    spec.loader.exec_module(mod)
    return mod


REQUEST_ARRAYS = (
    "phase",
    "block",
    "step_in_block",
    "kv_len",
    "n_decoded",
    "row_offset",
    "ids",
    "weights",
    "was_masked",
    "decoded",
)


def assert_same_request(got, want) -> None:
    """Two RequestArrays hold the same forwards, routing, weights and token flags (confidence NaN where the other's
    is), field by field."""
    for name in REQUEST_ARRAYS:
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    np.testing.assert_array_equal(
        got.confidence, want.confidence, err_msg="confidence"
    )  # (NaN equals NaN here)
