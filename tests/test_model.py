"""LLaDA2 model, checkpoint loader, block-diffusion decoding and the trace collector, on tiny checkpoints."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from traces.collect import Tokenizer, collect, load_prompts
from traces.model.config import CheckpointError, LLaDA2Config
from traces.model.decode import generate
from traces.model.loader import load_checkpoint, save_checkpoint
from traces.model.modeling import LLaDA2MoeModelLM
from traces.reader import Trace
from traces.routing import group_limited_topk
from traces.schema import COMMIT, DENOISE


def tiny_config(**kw) -> LLaDA2Config:
    base = dict(vocab_size=300, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                head_dim=8, intermediate_size=48, moe_intermediate_size=16, num_experts=16, num_experts_per_tok=4,
                n_group=4, topk_group=2, mask_token_id=299, eos_token_id=298, pad_token_id=298)
    base.update(kw)
    return LLaDA2Config(**base)


@pytest.fixture
def tiny_model():
    torch.manual_seed(0)
    m = LLaDA2MoeModelLM(tiny_config())
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.2)
    for moe in m.moe_layers():
        moe.gate.expert_bias.normal_(0, 0.1)
    return m.eval()


def test_checkpoint_roundtrip_by_name(tiny_model, tmp_path):
    path = save_checkpoint(tiny_model, tmp_path / "ckpt", shard_bytes=20_000)
    assert len(list(path.glob("*.safetensors"))) > 1  # sharded
    m = load_checkpoint(path)
    for (k, a), (_, b) in zip(tiny_model.state_dict().items(), m.state_dict().items()):
        torch.testing.assert_close(a, b, msg=k)
    assert "model.layers.1.mlp.experts.3.gate_proj.weight" in m.state_dict()
    assert "model.layers.2.mlp.gate.expert_bias" in m.state_dict()


def test_missing_and_mismatched_tensors_are_named(tiny_model, tmp_path):
    from safetensors.torch import load_file, save_file

    path = save_checkpoint(tiny_model, tmp_path / "ckpt")
    shard = next(path.glob("*.safetensors"))
    sd = load_file(str(shard))
    sd.pop("model.layers.1.attention.dense.weight")
    save_file(sd, str(shard))
    with pytest.raises(CheckpointError, match="missing tensor 'model.layers.1.attention.dense.weight'"):
        load_checkpoint(path)
    sd["model.layers.1.attention.dense.weight"] = torch.zeros(5, 5)
    save_file(sd, str(shard))
    with pytest.raises(CheckpointError, match=r"'model.layers.1.attention.dense.weight' has shape \(5, 5\)"):
        load_checkpoint(path)
    (path / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "nope")


def test_routing_equals_the_routing_math(tiny_model):
    gate = tiny_model.moe_layers()[0].gate
    x = torch.randn(10, 32)
    with torch.no_grad():
        idx, w, s = gate(x)
        logits = (x @ gate.weight.t()).numpy()
    sig = 1 / (1 + np.exp(-logits))
    ref = group_limited_topk(sig + gate.expert_bias.numpy(), 4, 2, 4)
    assert (np.sort(idx.numpy(), 1) == np.sort(ref, 1)).all()
    chosen = np.take_along_axis(sig, idx.numpy(), 1)
    np.testing.assert_allclose(w.numpy(), chosen / chosen.sum(1, keepdims=True) * 2.5, rtol=1e-5)


def test_cached_block_forward_equals_uncached(tiny_model):
    ids = torch.randint(0, 290, (1, 12))
    full = tiny_model(ids, block_length=4)
    cache = tiny_model.new_cache(1, 12, 4)
    blocks = torch.cat([tiny_model(ids[:, s:s + 4], start=s, cache=cache) for s in (0, 4, 8)], 1)
    torch.testing.assert_close(blocks, full, rtol=1e-4, atol=1e-5)
    cache = tiny_model.new_cache(1, 12, 4)  # a multi-block prefill is block-causal too
    torch.testing.assert_close(tiny_model(ids, start=0, cache=cache), full, rtol=1e-4, atol=1e-5)


def test_decoding_unmasks_at_least_one_token_per_step(tiny_model):
    recs = []
    out = generate(tiny_model, list(range(10)), 20, block_length=4, threshold=0.9, on_forward=recs.append)
    assert len(out) >= 1
    den = [r for r in recs if r.phase == DENOISE]
    assert den and all(int(r.decoded.sum()) >= 1 for r in den)
    assert all((r.decoded <= r.was_masked).all() for r in recs)
    blocks = {r.block for r in recs if r.phase != 0}
    assert all(sum(1 for r in recs if r.block == b and r.phase == COMMIT) == 1 for b in blocks)
    assert recs[1].ids.shape == (4, 2, 4)  # block rows x MoE layers x top-k


def test_collector_writes_a_valid_trace_and_resumes(tiny_model, tmp_path):
    ckpt = save_checkpoint(tiny_model, tmp_path / "ckpt")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"question": f"what is {i} plus {i}?"}) for i in range(3)))
    texts = load_prompts(prompts)
    tok = Tokenizer(ckpt, 300)
    out = tmp_path / "trace"

    class Stop(Exception):
        pass

    import traces.collect as C

    real = C.record_request
    calls = []

    def flaky(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise Stop()
        return real(*a, **k)

    C.record_request = flaky
    try:
        with pytest.raises(Stop):
            collect(tiny_model, tok, texts, out, "unit", max_new_tokens=8, block_length=4, progress=False)
    finally:
        C.record_request = real
    assert not out.exists() and len(list((tmp_path / "trace.parts").iterdir())) == 1
    calls.clear()
    C.record_request = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        collect(tiny_model, tok, texts, out, "unit", max_new_tokens=8, block_length=4, progress=False)
    finally:
        C.record_request = real
    assert len(calls) == 2  # the finished request was not recomputed
    tr = Trace.open(out)
    tr.validate()
    assert tr.source == "collected" and len(tr) == 3 and not (tmp_path / "trace.parts").exists()
    r = tr.request(0)
    assert r.n_decoded.sum() >= 1 and "what is" not in json.dumps(tr.meta)


def test_prompts_from_a_hugging_face_dataset(monkeypatch):
    """--hf-dataset goes through datasets.load_dataset; a missing package or hub is a clear error."""
    import sys
    import types

    from traces.collect import resolve_prompts
    from traces.errors import TraceError

    calls = []

    def load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        if name == "offline/none":
            raise ConnectionError("hub unreachable")
        return [{"question": f"q{i}", "answer": "a"} for i in range(5)]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    got = resolve_prompts(False, None, None, 3, "Question: {}\\nAnswer:", hf_dataset="openai/gsm8k:main")
    assert got == ["Question: q0\nAnswer:", "Question: q1\nAnswer:", "Question: q2\nAnswer:"]
    assert calls == [("openai/gsm8k", "main", "test")]
    with pytest.raises(TraceError, match="cannot be loaded: ConnectionError: hub unreachable"):
        resolve_prompts(False, hf_dataset="offline/none")
    with pytest.raises(TraceError, match=r"row 0: no field text \(has \['answer', 'question'\]\)"):
        resolve_prompts(False, field="text", hf_dataset="x/y")
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(TraceError, match="needs the 'datasets' package"):
        resolve_prompts(False, hf_dataset="x/y")
