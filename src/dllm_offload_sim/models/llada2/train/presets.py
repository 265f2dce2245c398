"""Model sizes for ``dllm-train``: LLaDA2.0-mini's routing topology at small widths, and a toy for CPU runs."""

from __future__ import annotations

from dataclasses import replace

from dllm_offload_sim.models.llada2.config import LLaDA2Config
from dllm_offload_sim.models.llada2.train.corpus import EOS, MASK, PAD, VOCAB


def small_mini_config() -> LLaDA2Config:
    """LLaDA2.0-mini's routing topology at small widths, byte vocabulary."""
    return LLaDA2Config(
        vocab_size=VOCAB,
        hidden_size=256,
        num_hidden_layers=20,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=768,
        moe_intermediate_size=64,
        num_experts=256,
        num_experts_per_tok=8,
        num_shared_experts=1,
        n_group=8,
        topk_group=4,
        first_k_dense_replace=1,
        routed_scaling_factor=2.5,
        rope_theta=10000.0,
        max_position_embeddings=4096,
        pad_token_id=PAD,
        mask_token_id=MASK,
        eos_token_id=EOS,
    )


def tiny_config() -> LLaDA2Config:
    """The same topology rules at toy sizes (3 layers, 32 experts): smoke runs and tests on a CPU."""
    return replace(
        small_mini_config(),
        hidden_size=64,
        num_hidden_layers=3,
        head_dim=16,
        intermediate_size=128,
        moe_intermediate_size=16,
        num_experts=32,
    )


PRESETS = {"small-mini": small_mini_config, "tiny": tiny_config}
