"""Training a LLaDA2-topology model: the block-diffusion mask, the objective, batched experts, a short run."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from dllm_offload_sim.models.llada2.loader import load_checkpoint
from dllm_offload_sim.models.llada2.modeling import (
    LLaDA2MoeModelLM,
    experts_grouped,
    experts_padded,
    gather_routes,
)
from dllm_offload_sim.models.llada2.train.corpus import EOS, MASK, Corpus, decode, encode, jsonl_documents
from dllm_offload_sim.models.llada2.train.objective import block_diffusion_mask, noise
from dllm_offload_sim.models.llada2.train.presets import tiny_config
from dllm_offload_sim.models.llada2.train.step import init_weights, lr_at, update_expert_bias
from dllm_offload_sim.models.llada2.train.train import train


def source_tree(tmp_path, adds: int, imports: int = 0):
    """A Python source tree to train on: ``adds`` copies of a small function, then ``imports`` of a two-line script."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text(
        "def add(a, b):\n    return a + b\n\n" * adds + "import os\nprint(os.sep)\n" * imports
    )
    return src


def test_block_diffusion_mask_matches_block_decoding():
    L, B = 8, 4
    m = block_diffusion_mask(L, B)
    # noisy row 5 (block 1): its own noisy block 4..7 and the clean block 0..3 only
    assert m[5].nonzero().flatten().tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    # noisy row 1 (block 0): its own noisy block only
    assert m[1].nonzero().flatten().tolist() == [0, 1, 2, 3]
    # clean row 8 + 5 (block 1): clean blocks 0 and 1, never a noisy row
    assert m[13].nonzero().flatten().tolist() == list(range(8, 16))


def test_noisy_rows_see_what_cached_block_decoding_sees():
    """The objective's noisy-block logits equal a block-decoding forward over a cache of clean blocks."""
    torch.manual_seed(0)
    model = LLaDA2MoeModelLM(tiny_config())
    init_weights(model, std=0.2)
    model.eval()
    L, B = 32, 16
    x0 = torch.randint(0, 256, (1, L))
    xt, _, _ = noise(x0, B, MASK, torch.Generator().manual_seed(1))
    pos = torch.arange(L).repeat(2)
    with torch.no_grad():
        train_logits = model.forward_masked(torch.cat([xt, x0], 1), pos, block_diffusion_mask(L, B), rows=L)
        cache = model.new_cache(1, L, B)
        model(x0[:, :B], start=0, cache=cache)  # the finished first block
        dec = model(xt[:, B:], start=B, cache=cache)  # the partly masked second block
    torch.testing.assert_close(train_logits[:, B:], dec, rtol=1e-4, atol=1e-4)


def test_padded_experts_equal_per_expert_sum():
    torch.manual_seed(0)
    E, H, I, N, k = 8, 12, 6, 20, 3
    x = torch.randn(N, H)
    idx = torch.stack([torch.randperm(E)[:k] for _ in range(N)])
    w = torch.rand(N, k)
    g, u, d = torch.randn(E, I, H), torch.randn(E, I, H), torch.randn(E, H, I)
    ref = torch.zeros(N, H)
    for n in range(N):
        for j in range(k):
            e = idx[n, j]
            ref[n] += w[n, j] * (d[e] @ (torch.nn.functional.silu(g[e] @ x[n]) * (u[e] @ x[n])))
    torch.testing.assert_close(experts_padded(x, idx, w, g, u, d), ref, rtol=1e-4, atol=1e-4)
    # a capacity of 1 row per expert keeps, for each expert, its first routed row only
    capped = experts_padded(x, idx, w, g, u, d, capacity=1)
    assert not torch.allclose(capped, ref)


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no grouped GEMM")
def test_grouped_experts_equal_padded_experts_with_their_gradients():
    """The training step's grouped-GEMM MoE (bf16, rows sorted by expert, one experts left without rows) gives
    the padded batch's output and the same gradients for the activations and all three weight stacks."""
    torch.manual_seed(0)
    E, H, I, N, k = 8, 64, 32, 40, 3
    idx = torch.stack([torch.randperm(E - 1)[:k] for _ in range(N)])  # expert E-1 gets no row
    w = torch.rand(N, k)
    base = [
        torch.randn(N, H),
        torch.randn(E, I, H) * H**-0.5,
        torch.randn(E, I, H) * H**-0.5,
        torch.randn(E, H, I) * I**-0.5,
    ]
    outs, grads = {}, {}
    for name, fn in (("grouped", experts_grouped), ("padded", experts_padded)):
        x, g, u, d = (t.clone().bfloat16().requires_grad_() for t in base)
        y = fn(x, idx, w, g, u, d)
        (y.float() ** 2).sum().backward()
        outs[name], grads[name] = y.float(), [t.grad.float() for t in (x, g, u, d)]
    torch.testing.assert_close(outs["grouped"], outs["padded"], rtol=2e-2, atol=2e-2)
    for a, b in zip(grads["grouped"], grads["padded"]):
        torch.testing.assert_close(a, b, rtol=5e-2, atol=5e-2 * float(b.abs().max()))
    assert grads["grouped"][1][E - 1].abs().max() == 0  # no row, no gradient


def test_gather_routes_is_indexing_with_a_gather_for_a_backward():
    """The MoE's dispatch (k copies of each token, in a permuted order) and its return (a permutation) give plain
    indexing's rows and gradients, the k copies' gradients summed."""
    torch.manual_seed(0)
    N, k, H = 7, 3, 5
    order = torch.randperm(N * k)
    back = torch.empty_like(order)
    back[order] = torch.arange(N * k)
    for x, src, inv, kk in ((torch.randn(N, H), order, back, k), (torch.randn(N * k, H), back, order, 1)):
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = gather_routes(a, src, inv, kk), b[src // kk]
        assert torch.equal(ya, yb)
        g = torch.randn_like(ya)
        ya.backward(g), yb.backward(g)
        torch.testing.assert_close(a.grad, b.grad)


def test_sorted_routes_count_and_order_the_routes_by_expert():
    """One sort gives the routes in expert order, its inverse, the routes per expert (experts without a route
    included) and the grouped GEMM's offsets."""
    from dllm_offload_sim.models.llada2.modeling import expert_counts, sort_routes

    torch.manual_seed(0)
    E, N, k = 9, 13, 3
    idx = torch.stack([torch.randperm(E - 2)[:k] for _ in range(N)])  # experts E-2 and E-1 get no route
    r = sort_routes(idx, E)
    e = idx.reshape(-1)
    assert torch.equal(r.counts, expert_counts(e, E)) and r.counts[-2:].tolist() == [0, 0]
    assert torch.equal(r.offs, torch.cumsum(r.counts, 0).to(torch.int32))
    assert bool((e[r.order].diff() >= 0).all()) and torch.equal(r.order[r.back], torch.arange(N * k))


@pytest.mark.parametrize("mini_routing", [False, True])
def test_the_router_selects_what_group_limited_top_k_selects(mini_routing):
    """The gate's group scores (each group's two best, by reductions), kept groups (an unsorted top-k) and top-k
    among the kept groups' experts (gathered, then mapped back) route every token exactly as the literal rule does:
    the top-2 sum per group by ``topk``, the best groups, then the top-k experts among them (in order of score); also
    at LLaDA2.0-mini's routing (256 experts, 8 groups, top-4 groups, top-8)."""
    from dllm_offload_sim.models.llada2.modeling import Gate

    torch.manual_seed(0)
    c = tiny_config()
    if mini_routing:
        c = dataclasses.replace(c, num_experts=256, n_group=8, topk_group=4, num_experts_per_tok=8)
    gate = Gate(c)
    torch.nn.init.normal_(gate.weight, 0.0, 0.5)
    gate.expert_bias.normal_(0.0, 0.1)
    x = torch.randn(300, c.hidden_size)
    idx, w, s = gate(x)
    b = s + gate.expert_bias
    gs = b.view(300, c.n_group, -1).topk(2, dim=-1).values.sum(-1)
    keep = gs.topk(c.topk_group, dim=-1).indices
    allowed = (
        torch.zeros_like(gs, dtype=torch.bool)
        .scatter_(1, keep, True)
        .repeat_interleave(c.num_experts // c.n_group, 1)
    )
    ref = b.masked_fill(~allowed, float("-inf")).topk(c.num_experts_per_tok, dim=-1).indices
    assert torch.equal(idx, ref)


def test_fused_experts_roundtrip_and_match():
    torch.manual_seed(0)
    model = LLaDA2MoeModelLM(tiny_config())
    init_weights(model, std=0.2)
    model.eval()
    x = torch.randint(0, 256, (1, 16))
    with torch.no_grad():
        before = model(x, block_length=16)
        for moe in model.moe_layers():
            moe.fuse_experts()
        fused = model(x, block_length=16)
        for moe in model.moe_layers():
            moe.unfuse_experts()
        after = model(x, block_length=16)
    torch.testing.assert_close(fused, before)
    torch.testing.assert_close(after, before)
    assert "model.layers.1.mlp.experts.0.up_proj.weight" in model.state_dict()


def test_bias_balancing_moves_towards_the_mean_load():
    model = LLaDA2MoeModelLM(tiny_config())
    moe = model.moe_layers()[0]
    for m in model.moe_layers():
        m.last_load = torch.arange(32)
    update_expert_bias(model, 0.01)
    b = moe.gate.expert_bias
    assert b[0] > 0 and b[31] < 0  # under-loaded up, over-loaded down


def test_learning_rate_schedule():
    assert lr_at(0, 1000, 1.0) == pytest.approx(0.01)
    assert lr_at(99, 1000, 1.0) == pytest.approx(1.0)
    assert lr_at(1000, 1000, 1.0) == pytest.approx(0.1)


def test_corpus_documents_and_windows(tmp_path):
    f = tmp_path / "qa.jsonl"
    f.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    docs = jsonl_documents(f)
    assert docs == ["Question: 1+1?\nAnswer: 2"]
    c = Corpus.build({"qa": docs * 50}, val_fraction=0.1)
    w = c.sample(np.random.default_rng(0), 3, 16)
    assert w.shape == (3, 16) and (w <= EOS).all()
    assert decode(encode("héllo")) == "héllo"
    (tmp_path / "bad.jsonl").write_text('{"question": "x"}\n')
    with pytest.raises(Exception, match="bad.jsonl, line 1"):
        jsonl_documents(tmp_path / "bad.jsonl")


def test_short_training_run_lowers_the_loss_and_writes_a_loadable_checkpoint(tmp_path):
    src = source_tree(tmp_path, 400)
    s = train(
        tmp_path / "run",
        steps=40,
        batch=8,
        seq_len=32,
        block=16,
        lr=3e-3,
        stdlib_root=str(src),
        config=tiny_config(),
        progress=False,
        sample_tokens=16,
        peak=1e-3,
    )
    assert s["last"]["val_loss"] < 0.7 * s["first"]["val_loss"]
    # throughput over the training steps, and model FLOPs against the given peak (1 GFLOP/s here)
    from dllm_offload_sim.models.llada2.train.throughput import train_step_flops

    assert s["tokens_per_s"] > 0 and 0 < s["train_s"] <= s["wall_s"] and s["last"]["tokens_per_s"] > 0
    assert 0 <= s["input_wait_s"] < s["train_s"]
    mfu = s["tokens_per_s"] / (8 * 32) * train_step_flops(tiny_config(), 8, 32) / 1e9
    assert s["mfu"] == pytest.approx(mfu, rel=1e-3)
    for f in ("train_log.csv", "loss_curve.png", "samples.md", "train_summary.json"):
        assert (tmp_path / "run" / f).is_file()
    m = load_checkpoint(tmp_path / "run" / "checkpoint")
    assert len(m.moe_layers()[0].experts) == 32


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no grouped GEMM")
def test_a_bf16_autocast_training_step_takes_the_grouped_experts(monkeypatch):
    """Under bf16 autocast (the GPU training step's; here on the CPU) the MoE layers run the grouped GEMMs, and
    the step's loss and gradients are finite."""
    import dllm_offload_sim.models.llada2.modeling as M

    calls = []
    real = M.experts_grouped
    monkeypatch.setattr(M, "experts_grouped", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    torch.manual_seed(0)
    model = LLaDA2MoeModelLM(tiny_config())
    init_weights(model, std=0.2)
    model.train()
    x = torch.randint(0, 256, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(x, block_length=8).float().logsumexp(-1).mean()
    loss.backward()
    assert len(calls) == len(model.moe_layers()) and torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_active_parameters_count_what_one_token_multiplies_through():
    """The model's own weights, minus the embeddings and the routed experts a token does not visit."""
    from dllm_offload_sim.models.llada2.train.throughput import active_parameters, train_flops_per_token

    c = tiny_config()
    m = LLaDA2MoeModelLM(c)
    total = sum(p.numel() for n, p in m.named_parameters() if "norm" not in n and "layernorm" not in n)
    unvisited = (c.num_experts - c.num_experts_per_tok) * 3 * c.hidden_size * c.moe_intermediate_size
    embed = c.vocab_size * c.hidden_size
    assert active_parameters(c) == total - embed - len(m.moe_layers()) * unvisited
    attn = 12 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * 64
    assert train_flops_per_token(c, 64) == 6 * active_parameters(c) + attn


def test_prefetched_batches_are_the_windows_sampling_in_the_loop_draws():
    from dllm_offload_sim.models.llada2.train.corpus import Corpus, PrefetchedBatches

    corpus = Corpus.build({"a": ["def f(x):\n    return x + 1\n" * 200], "b": ["print(1)\n" * 300]})
    want_rng, got_rng = np.random.default_rng(7), np.random.default_rng(7)
    want = [corpus.sample(want_rng, 4, 32) for _ in range(6)]
    pre = PrefetchedBatches(corpus, got_rng, 4, 32, depth=2)
    got = [pre.next().numpy() for _ in range(6)]
    pre.close()
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    bad = PrefetchedBatches(corpus, np.random.default_rng(0), 4, 10**6)  # windows longer than any source
    with pytest.raises(Exception, match="fewer than 1000000"):
        bad.next()
    bad.close()


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no grouped GEMM")
def test_compiled_layers_are_one_graph_per_layer_kind_and_match_eager():
    """``compile_layers`` on the bf16 grouped path: no graph break, one graph for the dense layer and one for the
    MoE layers, the same logits and router loads as eager up to bf16 rounding (which flips a few near-tied routes,
    so the logits are compared on average), and gradients that flow."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    model = LLaDA2MoeModelLM(tiny_config())
    init_weights(model)
    model.train()
    for moe in model.moe_layers():
        torch.nn.init.normal_(
            moe.gate.weight, 0.0, 0.5
        )  # routes far from ties, so that bf16 rounding keeps them
        moe.fuse_experts()
    L = 32
    mask = block_diffusion_mask(L, 16)
    ids, pos = torch.randint(0, 256, (2, 2 * L)), torch.arange(L).repeat(2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = model.forward_masked(ids, pos, mask)
        ref_load = [moe.last_load.clone() for moe in model.moe_layers()]
        model.compile_layers()
        out = model.forward_masked(ids, pos, mask)
    assert dict(torch._dynamo.utils.counters["graph_break"]) == {}
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2
    assert (out - ref).abs().mean() <= 0.05 * ref.abs().mean()
    # the router's loads (bias balancing reads them) are set by the compiled graph as by eager
    moved = sum(int((moe.last_load - r).abs().sum()) for moe, r in zip(model.moe_layers(), ref_load))
    assert moved <= 0.01 * sum(int(r.sum()) for r in ref_load)
    out.float().logsumexp(-1).mean().backward()
    g = model.moe_layers()[0].fused[0].grad
    assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0
    torch._dynamo.reset()


def test_one_token_blocks_are_always_masked_the_autoregressive_objective():
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randint(0, 256, (4, 16))
    xt, masked, t = noise(x0, 1, MASK, gen)
    assert masked.all() and (xt == MASK).all() and (t == 1).all()
    # a noisy row of block 1 sees itself (the mask token) and the clean tokens before it: next-token prediction
    m = block_diffusion_mask(4, 1)
    assert m[2].nonzero().flatten().tolist() == [2, 4, 5]
    from dllm_offload_sim.models.llada2.train.step import block_at

    assert [block_at(s, 10, 16, ((1, 0.3),)) for s in range(10)] == [1, 1, 1] + [16] * 7
    assert [block_at(s, 10, 16) for s in range(3)] == [16] * 3
    assert [block_at(s, 10, 16, ((1, 0.1), (4, 0.3))) for s in range(5)] == [1, 4, 4, 16, 16]


def test_block_stages_parse_and_name_what_is_wrong():
    from dllm_offload_sim.models.llada2.train.step import parse_block_stages

    assert parse_block_stages("1:0.1,4:0.25", 32) == ((1, 0.1), (4, 0.25))
    for bad, msg in (
        ("4", "needs BLOCK:FRACTION"),
        ("x:0.1", "needs BLOCK:FRACTION"),
        ("5:0.1", "divide"),
        ("4:0.3,8:0.2", "increase"),
        ("4:1.0", "increase"),
    ):
        with pytest.raises(ValueError, match=msg):
            parse_block_stages(bad, 32)


def test_corpus_source_weights_steer_the_training_windows_and_name_bad_ones():
    from dllm_offload_sim.traces.errors import TraceError

    src = {"a": ["a" * 5000], "b": ["b" * 5000]}
    c = Corpus.build(src, weights={"a": 3.0, "b": 0.0})
    w = c.sample(np.random.default_rng(0), 64, 8)
    assert (w == ord("a")).all() and "weight 3" in c.describe()
    held = c.sample(np.random.default_rng(0), 64, 8, "val")  # held-out windows weigh every source the same
    assert (held == ord("b")).any() and (held == ord("a")).any()
    with pytest.raises(TraceError, match="'c'"):
        Corpus.build(src, weights={"c": 1.0})
    with pytest.raises(TraceError, match="not all 0"):
        Corpus.build(src, weights={"a": 0.0, "b": 0.0})
    with pytest.raises(TraceError, match="-1"):
        Corpus.build(src, weights={"a": -1.0})


def test_a_run_trains_autoregressively_first_then_by_block_diffusion(tmp_path):
    src = source_tree(tmp_path, 200)
    s = train(
        tmp_path / "run",
        steps=8,
        batch=4,
        seq_len=32,
        block=16,
        stdlib_root=str(src),
        config=tiny_config(),
        progress=False,
        sample_tokens=4,
        ar_fraction=0.5,
    )
    import csv

    rows = list(csv.DictReader(open(tmp_path / "run" / "train_log.csv")))
    assert [(r["step"], r["block"]) for r in rows] == [("1", "1"), ("8", "16")]
    assert s["ar_fraction"] == 0.5 and s["val_bits_per_byte"] == pytest.approx(
        s["last"]["val_loss"] / np.log(2), 1e-3
    )
    from dllm_offload_sim.traces.errors import TraceError

    with pytest.raises(TraceError, match="ar_fraction 1"):
        train(
            tmp_path / "bad",
            steps=2,
            stdlib_root=str(src),
            config=tiny_config(),
            progress=False,
            ar_fraction=1.0,
        )


def test_the_training_benchmark_times_the_training_step(tmp_path, capsys):
    from tests.simkit import script_module

    bench = script_module("bench/bench_train.py")
    out = tmp_path / "b.json"
    assert (
        bench.main(
            [
                "--preset",
                "tiny",
                "--batches",
                "2",
                "--compile",
                "off",
                "--steps",
                "2",
                "--warmup",
                "1",
                "--seq-len",
                "32",
                "--json",
                str(out),
                "--profile-ops",
                "1",
            ]
        )
        == 0
    )
    (row,) = json.loads(out.read_text())["rows"]
    table = capsys.readouterr().out.split("## where a step's CPU time goes")[1].splitlines()
    ops = [
        o for o in (line.split(None, 3) for line in table[2:]) if len(o) == 4 and o[1].endswith("%")
    ]  # the rows
    assert "1 profiled steps" in table[0] and len(ops) > 3 and any(o[3].startswith("aten::") for o in ops)
    assert [float(o[0]) for o in ops] == sorted((float(o[0]) for o in ops), reverse=True)  # costliest first
    assert row["batch"] == 2 and row["tokens_per_s"] == pytest.approx(
        2 * 32 / (row["ms_per_step"] / 1e3), rel=0.01
    )
    assert 0 <= row["input_wait_ms"] <= row["ms_per_step"]
    assert np.isfinite(row["loss"]) and row["loss"] > 0


def test_a_shard_takes_its_rows_of_the_global_batch_windows_and_noise():
    """Rank r of w draws what one process would draw for the global batch (windows from the corpus, noise from the
    generator) and keeps rows [r*n, (r+1)*n)."""
    from dllm_offload_sim.models.llada2.train.corpus import PrefetchedBatches
    from dllm_offload_sim.models.llada2.train.shard import Shard

    corpus = Corpus.build({"a": ["def f(x):\n    return x + 1\n" * 200], "b": ["print(1)\n" * 300]})
    whole = corpus.sample(np.random.default_rng(3), 6, 32)
    for rank in range(3):
        pre = PrefetchedBatches(corpus, np.random.default_rng(3), 2, 32, shard=Shard(rank, 3))
        assert np.array_equal(pre.next().numpy(), whole[2 * rank : 2 * rank + 2])
        pre.close()
    x0 = torch.from_numpy(whole)
    xt, masked, t = noise(x0, 16, MASK, torch.Generator().manual_seed(5))
    for rank in range(3):
        got = noise(
            x0[2 * rank : 2 * rank + 2], 16, MASK, torch.Generator().manual_seed(5), shard=Shard(rank, 3)
        )
        for a, b in zip(got, (xt, masked, t)):
            assert torch.equal(a, b[2 * rank : 2 * rank + 2])
    with pytest.raises(ValueError, match="rank 3 of world 3"):
        Shard(3, 3)


@pytest.mark.slow
def test_a_data_parallel_run_trains_what_one_process_trains_on_the_global_batch(tmp_path):
    """Two gloo processes with 2 windows each (``dllm-train --gpus 2``'s launcher) train the model that one process
    trains with 4: the same windows, noise and schedule, the gradients averaged and the router loads summed, so the
    weights agree up to the order of floating-point sums and the expert biases exactly; the replicas agree with
    each other bit for bit. The two-process run is stopped after 2 steps and resumed. (No capacity: a per-process
    capacity would drop different rows.)"""
    from dllm_offload_sim.models.llada2.train.data_parallel import spawn
    from dllm_offload_sim.models.llada2.train.train import _train_rank

    src = source_tree(tmp_path, 200, imports=300)
    kw = dict(
        steps=4,
        seq_len=32,
        block=16,
        stdlib_root=str(src),
        config=tiny_config(),
        progress=False,
        sample_tokens=4,
        capacity_factor=None,
    )
    one = train(tmp_path / "one", batch=4, **kw)
    spawn(
        2, "cpu", _train_rank, dict(out=tmp_path / "two", batch=2, stop_at=2, **kw)
    )  # in two parts, resumed
    assert (tmp_path / "two" / "train_state.pt").is_file() and not (
        tmp_path / "two" / "train_summary.json"
    ).exists()
    spawn(2, "cpu", _train_rank, dict(out=tmp_path / "two", batch=2, resume=True, **kw))
    two = json.loads((tmp_path / "two" / "train_summary.json").read_text())
    assert two["world"] == 2 and two["global_batch"] == 4 and two["replicas_agree"] is True
    assert two["tokens_seen"] == one["tokens_seen"] == 4 * 4 * 32
    assert two["tokens_per_s_per_gpu"] == pytest.approx(two["tokens_per_s"] / 2, rel=1e-3)
    assert two["last"]["train_loss"] == pytest.approx(one["last"]["train_loss"], rel=1e-5)
    assert two["last"]["val_loss"] == pytest.approx(one["last"]["val_loss"], rel=1e-5)
    a = load_checkpoint(tmp_path / "one" / "checkpoint").state_dict()
    b = load_checkpoint(tmp_path / "two" / "checkpoint").state_dict()
    biases = [k for k in a if k.endswith("expert_bias")]
    assert (
        biases and all(torch.equal(a[k], b[k]) for k in biases) and any(a[k].abs().sum() > 0 for k in biases)
    )
    assert max((a[k].float() - b[k].float()).abs().max().item() for k in a) < 1e-5


def test_dllm_train_checks_its_data_parallel_arguments(capsys):
    from dllm_offload_sim.models.llada2.train.train import main

    for argv, msg in (
        (["--gpus", "0"], "--gpus 0 must be at least 1"),
        (["--gpus", "2", "--device", "cuda"], "--gpus 2: this host has"),
        (["--ar-fraction", "1"], "--ar-fraction 1.0 must be in"),
        (["--stop-at", "0"], "--stop-at 0 must be at least 1"),
        (["--block-stages", "3:0.1"], "--block-stages 3:0.1: stage '3:0.1'"),
        (["--block-stages", "1:0.1", "--ar-fraction", "0.2"], "give the autoregressive stage"),
        (["--gpus", "2", "--device", "cuda:1"], "choose GPUs with CUDA_VISIBLE_DEVICES"),
        (["--state-every-s", "-1"], "--state-every-s -1.0 must be >= 0"),
    ):
        if "cuda" in argv and torch.cuda.device_count() >= 2:
            continue
        with pytest.raises(SystemExit):
            main(["--out", "unused", *argv])
        assert msg in capsys.readouterr().err


@pytest.mark.slow
def test_the_training_benchmark_measures_data_parallel_scaling(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "b.json"
    r = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).parents[1] / "bench" / "bench_train.py"),
            "--preset",
            "tiny",
            "--batches",
            "2",
            "--compile",
            "off",
            "--gpus",
            "1,2",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--seq-len",
            "32",
            "--device",
            "cpu",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, f"bench_train.py exited {r.returncode}:\n{r.stderr[-3000:]}"
    one, two = json.loads(out.read_text())["rows"]
    assert (one["gpus"], two["gpus"]) == (1, 2) and one["scaling_efficiency"] == 1.0
    assert two["tokens_per_s"] == pytest.approx(2 * 2 * 32 / (two["ms_per_step"] / 1e3), rel=0.01)
    assert two["scaling_efficiency"] == pytest.approx(
        two["tokens_per_s_per_gpu"] / one["tokens_per_s"], abs=1e-3
    )


def test_a_run_stopped_and_resumed_trains_what_the_uninterrupted_run_trains(tmp_path):
    """``stop_at`` saves the run's state and stops; ``resume`` continues it, drawing the windows and noise the
    uninterrupted run would have drawn, to the same losses and weights; the state is removed once the run finishes.
    A resume with other settings, or a new run over an unfinished one, is refused and names why."""
    import csv

    from dllm_offload_sim.traces.errors import TraceError

    src = source_tree(tmp_path, 200, imports=300)
    kw = dict(
        steps=12,
        batch=4,
        seq_len=32,
        block=16,
        stdlib_root=str(src),
        config=tiny_config(),
        progress=False,
        sample_tokens=4,
    )
    whole = train(tmp_path / "whole", **kw)
    part = tmp_path / "part"
    assert train(part, stop_at=5, **kw) == {"stopped_at": 5, "state": str(part / "train_state.pt")}
    with pytest.raises(TraceError, match="holds an unfinished run; pass --resume"):
        train(part, **kw)
    with pytest.raises(TraceError, match="started with batch=4, this one has batch=2"):
        train(part, resume=True, **{**kw, "batch": 2})
    done = train(part, resume=True, **kw)
    assert not (part / "train_state.pt").exists()
    for k in ("train_loss", "masked_nll", "val_loss", "grad_norm"):
        assert done["last"][k] == pytest.approx(whole["last"][k], rel=1e-4)
    assert [r["step"] for r in csv.DictReader(open(part / "train_log.csv"))] == [
        "1",
        "5",
        "12",
    ]  # the stop logs
    a = load_checkpoint(tmp_path / "whole" / "checkpoint").state_dict()
    b = load_checkpoint(part / "checkpoint").state_dict()
    assert max((a[k].float() - b[k].float()).abs().max().item() for k in a) < 1e-4
    with pytest.raises(TraceError, match="has finished"):
        train(part, resume=True, **kw)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_data_parallel_training_on_two_gpus_over_nccl(tmp_path):
    """``dllm-train --gpus 2`` on GPUs: NCCL, bf16 grouped experts, compiled layers; the replicas agree bit for bit
    at the end, and the run's loss is close to one GPU's with the same global batch (bf16 sums differ)."""
    from dllm_offload_sim.models.llada2.train.train import main

    src = source_tree(tmp_path, 400, imports=600)
    common = [
        "--preset",
        "tiny",
        "--steps",
        "20",
        "--seq-len",
        "64",
        "--stdlib",
        str(src),
        "--sample-tokens",
        "4",
        "--quiet",
        "--compile",
        "--device",
        "cuda",
    ]
    assert main(["--out", str(tmp_path / "one"), "--batch", "8", *common]) == 0
    assert main(["--out", str(tmp_path / "two"), "--batch", "4", "--gpus", "2", *common]) == 0
    one = json.loads((tmp_path / "one" / "train_summary.json").read_text())
    two = json.loads((tmp_path / "two" / "train_summary.json").read_text())
    assert two["world"] == 2 and two["replicas_agree"] is True and two["tokens_seen"] == one["tokens_seen"]
    assert two["last"]["val_loss"] == pytest.approx(one["last"]["val_loss"], rel=0.02)


def test_the_confidence_term_is_the_entropy_of_the_correct_masked_predictions():
    """LLaDA2.0's CAP term: the entropy of the predicted distribution at masked rows predicted correctly, per row of
    the batch, added with its weight; a gradient step on it lowers that entropy (the correct predictions grow more
    confident), and the plain objective is unchanged without it."""
    from dllm_offload_sim.models.llada2.train.objective import diffusion_loss

    torch.manual_seed(0)
    B, L, V = 3, 16, 11
    x0 = torch.randint(0, V - 1, (B, L))
    x0[:, ::2] = 3  # plenty of rows the logits below predict correctly
    table = torch.randn(V, V) * 0.5
    table[3, 3] += 3.0
    weight = torch.nn.Parameter(table.clone())

    def forward(ids, pos, mask, rows=None):  # logits from each row's clean token (the second half of ids)
        return weight[ids[:, L:]]

    base, st0 = diffusion_loss(forward, x0, 16, V - 1, torch.Generator().manual_seed(1))
    loss, st = diffusion_loss(forward, x0, 16, V - 1, torch.Generator().manual_seed(1), confidence_weight=2.0)
    assert "confidence_loss" not in st0 and float(st["confidence_loss"]) > 0
    logits = weight[x0].detach()
    from dllm_offload_sim.models.llada2.train.objective import noise

    _, masked, _ = noise(x0, 16, V - 1, torch.Generator().manual_seed(1))
    p = logits.softmax(-1)
    ent = -(p * p.log()).sum(-1)
    correct = masked & (logits.argmax(-1) == x0)
    want = float((ent * correct).sum() / (B * L))
    assert float(st["confidence_loss"]) == pytest.approx(want, rel=1e-5)
    assert float(loss.detach()) == pytest.approx(float(base.detach()) + 2.0 * want, rel=1e-5)
    (loss - base).backward()  # the CAP term's gradient alone: the two share the diffusion term
    with torch.no_grad():
        weight -= 0.5 * weight.grad
    after = -(weight[x0].softmax(-1) * weight[x0].log_softmax(-1)).sum(-1).detach()
    assert float((after * correct).sum()) < float((ent * correct).sum())


def test_a_run_with_the_confidence_term_logs_it(tmp_path):
    import csv

    src = source_tree(tmp_path, 200)
    s = train(
        tmp_path / "run",
        steps=4,
        batch=4,
        seq_len=32,
        block=16,
        stdlib_root=str(src),
        config=tiny_config(),
        progress=False,
        sample_tokens=4,
        confidence_weight=0.5,
    )
    rows = list(csv.DictReader(open(tmp_path / "run" / "train_log.csv")))
    assert s["confidence_weight"] == 0.5 and all(float(r["confidence_loss"]) >= 0 for r in rows)


def test_a_run_steps_through_its_block_stages(tmp_path):
    """Blocks of 1 for the first quarter of the steps, then 4 until half, then the run's block 16; the log's block
    column says which a step used (the stop at step 3 logs a row inside the second stage)."""
    src = source_tree(tmp_path, 200)
    s = train(
        tmp_path / "run",
        steps=8,
        batch=4,
        seq_len=32,
        block=16,
        stdlib_root=str(src),
        config=tiny_config(),
        progress=False,
        sample_tokens=4,
        block_stages=((1, 0.25), (4, 0.5)),
        stop_at=3,
    )
    assert s["stopped_at"] == 3  # stopped inside the block-4 stage, then resumed through the rest
    import csv

    done = train(
        tmp_path / "run",
        steps=8,
        batch=4,
        seq_len=32,
        block=16,
        stdlib_root=str(src),
        config=tiny_config(),
        progress=False,
        sample_tokens=4,
        block_stages=((1, 0.25), (4, 0.5)),
        resume=True,
    )
    rows = list(csv.DictReader(open(tmp_path / "run" / "train_log.csv")))
    assert [(r["step"], r["block"]) for r in rows] == [("1", "1"), ("3", "4"), ("8", "16")]
    assert done["block_stages"] == [[1, 0.25], [4, 0.5]]


def test_flex_attention_sees_what_the_boolean_mask_lets_through(tmp_path):
    """The training step's two attentions: FlexAttention under the block-diffusion block mask gives the logits the
    boolean mask gives (forward, on a CPU: FlexAttention has no backward there, so training with it is refused)."""
    import warnings

    from torch.nn.attention.flex_attention import flex_attention

    from dllm_offload_sim.models.llada2.train.objective import FlexMask, attention_mask
    from dllm_offload_sim.traces.errors import TraceError

    torch.manual_seed(0)
    model = LLaDA2MoeModelLM(tiny_config())
    init_weights(model, std=0.2)
    model.eval()
    L, block = 32, 8
    ids = torch.randint(0, 256, (2, 2 * L))
    pos = torch.arange(L).repeat(2)
    flex = attention_mask(L, block, "cpu", "flex")
    assert isinstance(flex, FlexMask) and flex.attend is flex_attention  # not compiled on a CPU
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention warns that it is slow
        ref = model.forward_masked(ids, pos, attention_mask(L, block, "cpu", "sdpa"), rows=L)
        got = model.forward_masked(ids, pos, flex, rows=L)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="attention='dense'"):
        attention_mask(L, block, "cpu", "dense")
    with pytest.raises(TraceError, match="no backward on a CPU"):
        train(tmp_path / "run", steps=1, config=tiny_config(), progress=False, attention="flex")
    assert not (tmp_path / "run").exists()  # refused before anything is written


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_flex_attention_trains_what_sdpa_trains_on_a_gpu():
    """One bf16 training step with FlexAttention (compiled) and with scaled-dot-product attention from the same
    weights and batch: the same loss and gradients up to bf16 rounding."""
    from dllm_offload_sim.models.llada2.train.objective import attention_mask, diffusion_loss
    from dllm_offload_sim.models.llada2.train.step import training_model

    L, block = 64, 16
    x0 = torch.randint(0, 256, (4, L), device="cuda")
    grads, losses = {}, {}
    for att in ("sdpa", "flex"):
        torch.manual_seed(0)
        model = training_model(tiny_config(), "cuda")
        gen = torch.Generator(device="cuda").manual_seed(0)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, _ = diffusion_loss(
                model.forward_masked, x0, block, MASK, gen, attention_mask(L, block, "cuda", att)
            )
        loss.backward()
        losses[att] = float(loss)
        grads[att] = torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])
    assert losses["flex"] == pytest.approx(losses["sdpa"], rel=1e-2)
    cos = torch.nn.functional.cosine_similarity(grads["flex"], grads["sdpa"], dim=0)
    assert cos > 0.99, float(cos)
