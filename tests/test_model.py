"""LLaDA2 model, checkpoint loader, block-diffusion decoding and the trace collector, on tiny checkpoints."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dllm_offload_sim.models.llada2.collect import Tokenizer, collect, load_prompts
from dllm_offload_sim.models.llada2.config import CheckpointError, LLaDA2Config
from dllm_offload_sim.models.llada2.decode import generate
from dllm_offload_sim.models.llada2.loader import load_checkpoint, save_checkpoint
from dllm_offload_sim.models.llada2.modeling import LLaDA2MoeModelLM
from dllm_offload_sim.traces.errors import TraceError
from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.traces.routing import group_limited_topk
from dllm_offload_sim.traces.schema import COMMIT, DENOISE, PREFILL


def tiny_config(**kw) -> LLaDA2Config:
    base = dict(
        vocab_size=300,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=48,
        moe_intermediate_size=16,
        num_experts=16,
        num_experts_per_tok=4,
        n_group=4,
        topk_group=2,
        mask_token_id=299,
        eos_token_id=298,
        pad_token_id=298,
    )
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
    blocks = torch.cat([tiny_model(ids[:, s : s + 4], start=s, cache=cache) for s in (0, 4, 8)], 1)
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

    import dllm_offload_sim.models.llada2.collect as C

    real = C.record_batch
    calls = []

    def flaky(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise Stop()
        return real(*a, **k)

    C.record_batch = flaky
    try:
        with pytest.raises(Stop):
            collect(tiny_model, tok, texts, out, "unit", max_new_tokens=8, block_length=4, progress=False)
    finally:
        C.record_batch = real
    assert not out.exists() and len(list((tmp_path / "trace.parts").glob("req_*"))) == 1
    # a resume with other decoding settings or other prompts is refused, and the saved part kept
    with pytest.raises(TraceError, match="other settings"):
        collect(tiny_model, tok, texts, out, "unit", max_new_tokens=16, block_length=4, progress=False)
    with pytest.raises(TraceError, match="another prompt"):
        collect(
            tiny_model,
            tok,
            ["other"] + texts[1:],
            out,
            "unit",
            max_new_tokens=8,
            block_length=4,
            progress=False,
        )
    assert len(list((tmp_path / "trace.parts").glob("req_*"))) == 1
    calls.clear()
    C.record_batch = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        collect(tiny_model, tok, texts, out, "unit", max_new_tokens=8, block_length=4, progress=False)
    finally:
        C.record_batch = real
    assert len(calls) == 2  # the finished request was not recomputed
    tr = Trace.open(out)
    tr.validate()
    assert tr.source == "collected" and len(tr) == 3 and not (tmp_path / "trace.parts").exists()
    r = tr.request(0)
    assert r.n_decoded.sum() >= 1 and "what is" not in json.dumps(tr.meta)


def test_collector_decodes_batches_and_resumes_a_partial_batch(tiny_model, tmp_path):
    """--batch-size 2: prompts decoded in lockstep, one request per part; a batch with a missing request
    is decoded again and only the missing one written; the result equals an uninterrupted run."""
    import dllm_offload_sim.models.llada2.collect as C

    ckpt = save_checkpoint(tiny_model, tmp_path / "ckpt")
    texts = ["what is 1?", "a longer question: what is 2 plus 2?", "3"]
    tok = Tokenizer(ckpt, 300)
    full = collect(
        tiny_model,
        tok,
        texts,
        tmp_path / "full",
        "unit",
        max_new_tokens=8,
        block_length=4,
        progress=False,
        batch_size=2,
    )
    t = Trace.open(full)
    t.validate()
    assert len(t) == 3 and t.meta["decoding"]["batch_size"] == 2
    # interrupted after the first batch, with request 1's part lost: the rerun redoes batch [0, 1] only
    calls = []
    real = C.record_batch
    C.record_batch = lambda m, tk, ps, rids, *a, **k: (
        calls.append(list(rids)) or real(m, tk, ps, rids, *a, **k)
    )
    try:
        parts = tmp_path / "part.parts"
        collect(
            tiny_model,
            tok,
            texts[:2],
            tmp_path / "first2",
            "unit",
            max_new_tokens=8,
            block_length=4,
            progress=False,
            batch_size=2,
        )
        calls.clear()
        parts.mkdir()
        from dllm_offload_sim.traces.writer import write_trace

        req0 = Trace.open(tmp_path / "first2").request(0)
        write_trace(
            parts / "req_000000",
            t.topology,
            [req0],
            "collected",
            t.meta["decoding"],
            "unit",
            extra={"prompt_sha256": C._sha(texts[0])},
        )
        out = collect(
            tiny_model,
            tok,
            texts,
            tmp_path / "part",
            "unit",
            max_new_tokens=8,
            block_length=4,
            progress=False,
            batch_size=2,
        )
    finally:
        C.record_batch = real
    batches = C.plan_batches([len(tok.encode(q)) for q in texts], 2, 4)
    assert calls == [b for b in batches if b != [0]]  # the finished prompt 0 is redone only with a batch mate
    a, b = Trace.open(out), Trace.open(full)
    for rid in range(3):
        np.testing.assert_array_equal(a.request(rid).ids, b.request(rid).ids)
        np.testing.assert_array_equal(a.request(rid).decoded, b.request(rid).decoded)
    with pytest.raises(TraceError, match="--batch-size must be >= 1"):
        collect(tiny_model, tok, texts, tmp_path / "bad", "unit", progress=False, batch_size=0)


def test_batches_hold_prompts_whose_lengths_differ_by_whole_blocks():
    from dllm_offload_sim.models.llada2.collect import plan_batches

    assert plan_batches([10, 19, 14, 26, 3], 2, 16) == [[0, 3], [1, 4], [2]]
    assert plan_batches([5, 5, 5], 2, 4) == [[0, 1], [2]]


def test_batched_decoding_equals_each_prompt_alone_or_refuses(tiny_model):
    """A 10-token prompt batched with a 19-token one would decode other tokens than alone: refused. Lengths
    that differ by whole blocks decode exactly what each decodes alone."""
    from dllm_offload_sim.models.llada2.decode import generate_batch

    p10, p19, p14 = list(range(3, 13)), list(range(20, 39)), list(range(40, 54))
    with pytest.raises(ValueError, match="differ by whole blocks of 16 tokens"):
        generate_batch(tiny_model, [p10, p19], 8, 16)
    alone = [generate(tiny_model, q, 12, 4) for q in (p10, p14)]
    assert generate_batch(tiny_model, [p10, p14], 12, 4) == alone


def test_prefill_and_unrolled_forwards_follow_dinfer(tiny_model):
    """A prompt shorter than a block still gets a counted B-token prefill forward; with unroll, forwards come in
    groups of max(min(masks // 8, 4), 2) and a no-mask forward of a group takes the commit's place."""
    from dllm_offload_sim.models.llada2.decode import unroll_forwards

    assert [unroll_forwards(m) for m in (1, 8, 16, 31, 32, 64)] == [2, 2, 2, 3, 4, 4]
    assert unroll_forwards(30, unroll=False) == 1
    recs = []
    generate(tiny_model, [5, 6, 7], 8, 4, threshold=0.0, on_forward=recs.append, unroll=True)
    assert recs[0].phase == PREFILL and recs[0].ids.shape[0] == 4  # max(floor(3/4)*4, 4) = 4 rows
    by_block = {}
    for r in recs[1:]:
        by_block.setdefault(r.block, []).append(r)
    for blk, rs in by_block.items():
        masks = [int(r.was_masked.sum()) for r in rs]
        # threshold 0: every denoising forward unmasks all; unroll 2: one unmasking forward, then one over no mask
        # (the commit's place): two forwards per block, none of them an extra commit
        assert len(rs) == 2 and masks[0] > 0 and masks[1] == 0 and rs[1].phase == COMMIT, (blk, masks)
    recs = []
    generate(tiny_model, [5, 6, 7], 8, 4, threshold=0.0, on_forward=recs.append, unroll=False)
    assert all(len([r for r in recs[1:] if r.block == b]) == 2 for b in {r.block for r in recs[1:]})


def test_prompts_from_a_hugging_face_dataset(monkeypatch):
    """--hf-dataset goes through datasets.load_dataset; a missing package or hub is a clear error."""
    import sys
    import types

    from dllm_offload_sim.models.llada2.collect import resolve_prompts
    from dllm_offload_sim.traces.errors import TraceError

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


def test_batched_decoding_equals_one_by_one_when_padding_is_whole_blocks(tiny_model):
    """Lockstep decoding of a batch: with prompts of equal length, or padded by whole blocks, each row
    decodes exactly what it decodes alone (pad positions are never attended, RoPE starts at 0)."""
    from dllm_offload_sim.models.llada2.decode import generate_batch

    a = [5, 17, 42, 7, 99, 3, 250, 11]  # 8 tokens: one block of 8
    b = [200, 100, 50, 25, 12, 6, 3, 1]  # 8 tokens
    long = a + b  # 16 tokens: pads `a` and `b` by one whole block
    kw = dict(max_new_tokens=24, block_length=8, threshold=0.5)
    alone = [generate(tiny_model, q, **kw) for q in (a, b, long)]
    assert generate_batch(tiny_model, [a, b], **kw) == alone[:2]
    assert generate_batch(tiny_model, [a, long], **kw) == [alone[0], alone[2]]


def test_batched_decoding_reports_each_rows_real_positions(tiny_model):
    from dllm_offload_sim.models.llada2.decode import generate_batch

    prompts = [[5, 17, 42], [7, 99, 3, 250, 11, 64, 8, 1, 2, 3, 4]]  # 3 and 11 tokens: 8 pads on row 0
    recs = {0: [], 1: []}
    outs = generate_batch(
        tiny_model,
        prompts,
        max_new_tokens=16,
        block_length=4,
        threshold=0.6,
        on_forward=lambda b, r: recs[b].append(r),
    )
    assert all(len(o) > 0 for o in outs)
    for b, rs in recs.items():
        pre = [r for r in rs if r.phase == 0]
        n_pre = sum(int(r.ids.shape[0]) for r in pre)
        assert n_pre == (
            8 if b == 1 else 0
        )  # the prefill covers blocks [0, 8): 8 real rows of row 1, none of row 0
        for r in rs:
            assert r.ids.shape[0] == r.weights.shape[0] == r.confidence.shape[0]
            if r.phase == DENOISE and r.was_masked.any():
                assert int(r.decoded.sum()) >= 1  # at least one token per step where the row has masks
    # the first decode block [8, 12) holds both rows' last 3 prompt tokens and one mask; row 0's pads
    # (positions 0-7) are in no record, and its attention context excludes them (kv_len 0, row 1's 8)
    for b, kv in ((0, 0), (1, 8)):
        first_dec = next(r for r in recs[b] if r.phase == DENOISE)
        assert first_dec.ids.shape[0] == 4 and int(first_dec.was_masked.sum()) == 1 and first_dec.kv_len == kv


def test_expert_bias_keeps_the_checkpoints_dtype(tiny_model, tmp_path):
    """An fp32 expert bias loaded into a bf16 model stays fp32 (as dInfer keeps it): bf16 would round it and
    route some tokens to other experts."""
    g = tiny_model.moe_layers()[0].gate
    g.expert_bias.copy_(torch.linspace(0, 1, g.expert_bias.numel()) + 1e-3)  # not representable in bf16
    ckpt = save_checkpoint(tiny_model, tmp_path / "ckpt")
    m = load_checkpoint(ckpt, dtype=torch.bfloat16)
    b = m.moe_layers()[0].gate.expert_bias
    assert b.dtype == torch.float32 and torch.equal(b, g.expert_bias.float())
    assert next(m.parameters()).dtype == torch.bfloat16


@pytest.mark.parametrize(
    "key, value",
    [("use_qk_norm", False), ("rope_scaling", {"type": "yarn", "factor": 4}), ("score_function", "softmax")],
)
def test_config_values_the_model_does_not_implement_are_refused(tiny_model, tmp_path, key, value):
    ckpt = save_checkpoint(tiny_model, tmp_path / "ckpt")
    d = json.loads((ckpt / "config.json").read_text())
    d[key] = value
    (ckpt / "config.json").write_text(json.dumps(d))
    with pytest.raises(CheckpointError, match=f"{key}=.* is not implemented by this model"):
        load_checkpoint(ckpt)


def test_the_dinfer_chat_template_preset(tmp_path):
    from dllm_offload_sim.models.llada2.collect import resolve_prompts

    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "1+1?"}\n')
    assert resolve_prompts(False, f, None, None, "dinfer-chat") == [
        "<role>SYSTEM</role>detailed thinking off<|role_end|><role>HUMAN</role>1+1?<|role_end|><role>ASSISTANT</role>"
    ]
    assert resolve_prompts(False, f, None, None, "question-answer") == ["Question: 1+1?\nAnswer:"]
