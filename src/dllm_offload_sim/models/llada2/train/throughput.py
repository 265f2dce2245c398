"""Training throughput in model FLOPs: what one token costs a training step, and the GPU's share of its peak."""

from __future__ import annotations

from dllm_offload_sim.models.llada2.config import LLaDA2Config

# dense bf16 peak of the GPUs the training runs on (vendor datasheets, TFLOP/s, no sparsity); --peak-tflops for others
PEAK_BF16_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0}


def active_parameters(c: LLaDA2Config) -> int:
    """Weights one token multiplies through (embeddings excluded, the lm-head included): attention, the dense MLP
    of the first layers, and per MoE layer the router, the shared expert and ``top_k`` routed experts."""
    H, hd = c.hidden_size, c.head_dim
    attn = H * (c.num_attention_heads + 2 * c.num_key_value_heads) * hd + c.num_attention_heads * hd * H
    dense = 3 * H * c.intermediate_size
    expert = 3 * H * c.moe_intermediate_size
    moe = c.num_experts * H + c.num_shared_experts * expert + c.num_experts_per_tok * expert
    n_dense = c.first_k_dense_replace
    n_moe = c.num_hidden_layers - n_dense
    return c.num_hidden_layers * attn + n_dense * dense + n_moe * moe + H * c.vocab_size


def train_flops_per_token(c: LLaDA2Config, context: int) -> float:
    """Model FLOPs of one token in a training step (forward and backward): 6 per active weight, plus attention's
    scores and values over ``context`` positions (12 x layers x heads x head_dim x context)."""
    return (
        6.0 * active_parameters(c) + 12.0 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * context
    )


def peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU named ``device_name`` (``torch.cuda.get_device_name()``), None if unknown."""
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in device_name), None)


def train_step_flops(c: LLaDA2Config, batch: int, seq_len: int) -> float:
    """Model FLOPs of one step of the block-diffusion objective: each of ``batch`` windows runs as ``[noisy |
    clean]`` (2 x ``seq_len`` rows through every layer, attention over those 2 x ``seq_len`` positions), and the
    lm-head scores the ``seq_len`` noisy rows."""
    head = c.hidden_size * c.vocab_size
    rows = 2 * seq_len
    trunk = (
        6.0 * (active_parameters(c) - head)
        + 12.0 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * rows
    )
    return batch * (rows * trunk + seq_len * 6.0 * head)
