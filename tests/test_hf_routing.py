"""dllm-trace-record-hf on tiny random-weight OLMoE, Qwen3-MoE and Mixtral checkpoints built from configuration (no
download): the routers are found and hooked, the routing recorded is the model's own, and the trace checks and
simulates; a tiny Qwen3-MoE with Qwen3-30B-A3B's routing topology records under that model's sizes."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from dllm_offload_sim.models.hf_routing import RouterRecorder, record_trace, routers, topology_of  # noqa: E402
from dllm_offload_sim.traces.catalogue import load_model_file  # noqa: E402
from dllm_offload_sim.traces.check import check_trace  # noqa: E402
from dllm_offload_sim.traces.reader import Trace  # noqa: E402

TINY = dict(
    vocab_size=96,
    eos_token_id=None,
    bos_token_id=None,
    pad_token_id=None,
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def tiny(family: str, **over):
    if family == "olmoe":
        cfg = transformers.OlmoeConfig(
            **TINY, intermediate_size=16, num_experts=8, num_experts_per_tok=2, **over
        )
        cls = transformers.OlmoeForCausalLM
    elif family == "qwen3":
        shape = {"num_experts": 8, "num_experts_per_tok": 2, **TINY, **over}
        cfg = transformers.Qwen3MoeConfig(**shape, intermediate_size=48, moe_intermediate_size=16, head_dim=8)
        cls = transformers.Qwen3MoeForCausalLM
    else:
        cfg = transformers.MixtralConfig(
            **TINY, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2
        )
        cls = transformers.MixtralForCausalLM
    torch.manual_seed(0)
    return cls(cfg).eval()


def _qwen3_table(tmp_path, trace_dir, cache: int, *more: str):
    """The main job's table of naive_lru and OLED at ``cache`` on ``trace_dir`` as qwen3-30b-a3b, with the profile
    ``dllm-profile-estimate`` wrote into ``tmp_path``."""
    from hydra import compose, initialize_config_dir

    from dllm_offload_sim.sim.app import run_table
    from dllm_offload_sim.wiring.build import CONF_DIR

    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        cfg = compose(
            config_name="config",
            overrides=[
                "model=qwen3-30b-a3b",
                f"trace.path={trace_dir}",
                "hw=h200",
                f"hw.profile={tmp_path / 'h200-qwen3-30b-a3b.estimated.json'}",
                f"table.caches=[{cache}]",
                "table.policies=[naive_lru,oled]",
                "table.jobs=1",
                *more,
            ],
        )
    return run_table(cfg, progress=False)


@pytest.mark.parametrize("family, experts", [("olmoe", 8), ("qwen3", 8), ("mixtral", 4)])
def test_a_tiny_checkpoint_records_its_own_routing_into_a_trace_that_checks(tmp_path, family, experts):
    model = tiny(family)
    assert [i for i, _ in routers(model)] == [0, 1, 2]
    topo = topology_of(model, name=f"tiny-{family}")
    assert (topo.n_experts, topo.top_k, topo.moe_layers, topo.hidden) == (experts, 2, (0, 1, 2), 32)

    # the hook reads what the router computed: the softmax top-2 of its own logits
    rec = RouterRecorder(model, topo.top_k)
    x = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        model(input_ids=x)
    e, w = rec.last[1]
    rec.close()
    h = {}
    gate = routers(model)[1][1]

    def keep_input(module, args, out):
        h["in"] = args[0]

    handle = gate.register_forward_hook(keep_input)
    with torch.no_grad():
        model(input_ids=x)
    handle.remove()
    logits = h["in"].reshape(-1, 32) @ gate.weight.T
    top = torch.softmax(logits.float(), -1).topk(2, dim=-1)
    assert np.array_equal(e, top.indices.numpy()) and e.shape == (5, 2)

    ckpt = tmp_path / "ckpt"
    model.save_pretrained(ckpt)
    trace_dir, model_file = record_trace(ckpt, [[1, 2, 3, 4], [5, 6, 7]], 6, tmp_path / "t")
    trace = Trace.open(trace_dir)
    assert load_model_file(model_file).topology == trace.topology
    assert check_trace(trace).problems == ()
    r = trace.request(1)
    assert list(r.n_tokens) == [3] + [1] * 6 and list(r.kv_len[:3]) == [0, 3, 4] and r.n_decoded.sum() == 6
    assert np.isfinite(r.confidence).all() and (r.ids < experts).all()


def test_a_tiny_model_with_qwen3_30b_a3b_routing_records_under_its_sizes_and_simulates(tmp_path):
    from dllm_offload_sim.costmodel.estimate import main as estimate

    model = tiny("qwen3", num_hidden_layers=48, num_experts=128, num_experts_per_tok=8)
    ckpt = tmp_path / "ckpt"
    model.save_pretrained(ckpt)
    trace_dir, model_file = record_trace(ckpt, [[1, 2, 3, 4, 5, 6]], 8, tmp_path / "t", shape="qwen3-30b-a3b")
    assert model_file is None and Trace.open(trace_dir).topology.name == "qwen3-30b-a3b"
    assert estimate(["--model", "qwen3-30b-a3b", "--out", str(tmp_path)]) == 0
    table = _qwen3_table(tmp_path, trace_dir, 16, "sim.dummy_warmup=false", "sim.warmup_requests=0")
    assert list(table.policy) == ["naive_lru", "oled"] and (table.tpot_ms > 0).all()


@pytest.mark.parametrize("family", ["olmoe", "qwen3", "mixtral"])
def test_block_diffusion_decoding_records_denoising_and_commit_forwards(tmp_path, family):
    """By blocks of 4 (the last one 2 tokens), every block has denoising forwards that decode at least one masked
    token each and then one commit forward over the finished block; the forwards' context is the prompt and the
    blocks before; the trace checks."""
    from dllm_offload_sim.models.hf_routing import BlockDecoding
    from dllm_offload_sim.traces.schema import COMMIT, DENOISE, PREFILL

    ckpt = tmp_path / "ckpt"
    tiny(family).save_pretrained(ckpt)
    trace_dir, _ = record_trace(
        ckpt, [[1, 2, 3, 4], [5, 6, 7]], 10, tmp_path / "t", decoding=BlockDecoding(4, 95, 0.9)
    )
    trace = Trace.open(trace_dir)
    assert check_trace(trace).problems == ()
    assert trace.meta["decoding"] == {"block_length": 4, "mode": "block-diffusion"}
    for rid, P in ((0, 4), (1, 3)):
        r = trace.request(rid)
        assert r.phase[0] == PREFILL and r.n_tokens[0] == P and r.n_decoded.sum() == 10
        for blk, size in ((1, 4), (2, 4), (3, 2)):
            f = np.flatnonzero(r.block == blk)
            assert list(r.step_in_block[f]) == list(range(len(f)))
            assert set(r.n_tokens[f]) == {size} and set(r.kv_len[f]) == {P + 4 * (blk - 1)}
            assert list(r.phase[f]) == [DENOISE] * (len(f) - 1) + [COMMIT]
            assert (r.n_decoded[f[:-1]] >= 1).all() and r.n_decoded[f[-1]] == 0
            assert r.n_decoded[f].sum() == size  # every position of the block decoded once


def test_one_tiny_model_autoregressive_and_by_blocks_simulates_side_by_side(tmp_path):
    """The same checkpoint recorded both ways gives two traces of one model that one table compares: by blocks, a
    forward routes more rows, so a layer activates more experts."""
    from dllm_offload_sim.costmodel.estimate import main as estimate
    from dllm_offload_sim.models.hf_routing import BlockDecoding

    ckpt = tmp_path / "ckpt"
    tiny("qwen3", num_hidden_layers=48, num_experts=128, num_experts_per_tok=8).save_pretrained(ckpt)
    prompts = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10]]
    ar, _ = record_trace(ckpt, prompts, 16, tmp_path / "ar", shape="qwen3-30b-a3b")
    bd, _ = record_trace(
        ckpt, prompts, 16, tmp_path / "bd", shape="qwen3-30b-a3b", decoding=BlockDecoding(8, 95, 0.9)
    )
    assert estimate(["--model", "qwen3-30b-a3b", "--out", str(tmp_path)]) == 0
    a, b = (_qwen3_table(tmp_path, trace_dir, 32) for trace_dir in (ar, bd))
    assert list(a.columns) == list(b.columns) and list(a.policy) == list(b.policy) == ["naive_lru", "oled"]
    assert (a.tpot_ms > 0).all() and (b.tpot_ms > 0).all()
    assert (b.tokens_per_forward > a.tokens_per_forward).all()  # several tokens decoded per forward by blocks
    assert (b.activations / b.forwards > a.activations / a.forwards).all()  # more experts a forward


def test_the_command_needs_a_mask_token_for_block_diffusion(tmp_path, capsys):
    from dllm_offload_sim.models.hf_routing import main

    ckpt = tmp_path / "ckpt"
    tiny("olmoe").save_pretrained(ckpt)
    base = [
        "--checkpoint",
        str(ckpt),
        "--random-prompts",
        "1",
        "--max-new-tokens",
        "4",
        "--out",
        str(tmp_path / "t"),
    ]
    assert main(base + ["--decoding", "block-diffusion"]) == 2
    assert "has no mask_token_id" in capsys.readouterr().err and not (tmp_path / "t").exists()
    assert main(base + ["--decoding", "block-diffusion", "--mask-token-id", "96"]) == 2
    assert "not a token of the vocabulary (0..95)" in capsys.readouterr().err
    assert main(base + ["--decoding", "block-diffusion", "--mask-token-id", "95", "--block-length", "2"]) == 0
    assert Trace.open(tmp_path / "t").meta["decoding"]["block_length"] == 2
