"""One optimiser step of the block-diffusion objective and what it needs: the model in training form, its
initialisation, AdamW, the learning-rate and objective schedules, and the router's aux-loss-free bias update."""

from __future__ import annotations

import math

import torch

from dllm_offload_sim.models.llada2.config import LLaDA2Config
from dllm_offload_sim.models.llada2.modeling import LLaDA2MoeModelLM
from dllm_offload_sim.models.llada2.train.corpus import MASK
from dllm_offload_sim.models.llada2.train.data_parallel import DataParallel
from dllm_offload_sim.models.llada2.train.objective import diffusion_loss

WARMUP = 100  # linear warm-up steps, then cosine decay to LR_FLOOR * LR
LR_FLOOR = 0.1  # final learning rate as a fraction of the peak
WEIGHT_DECAY = 0.1  # AdamW weight decay on matrices
BIAS_RATE = 5e-3  # aux-loss-free router bias update per step (faster than LLaDA2's 1e-3: a short run)
GATE_STD = 0.003  # router init: small logits so that the bias, not the init, decides the first routes
# the padded MoE path drops routed rows beyond 2x an expert's mean load (bounded memory)
CAPACITY_FACTOR = 2.0


def init_weights(model: LLaDA2MoeModelLM, std: float = 0.02) -> None:
    """Matrices ~ N(0, std), output projections scaled by 1/sqrt(2 * layers), norms at 1, biases 0."""
    scale = 1 / math.sqrt(2 * model.config.num_hidden_layers)
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            torch.nn.init.normal_(
                p, 0.0, std * (scale if name.endswith(("down_proj.weight", "dense.weight")) else 1)
            )
        else:
            torch.nn.init.ones_(p)
    for moe in model.moe_layers():
        torch.nn.init.normal_(moe.gate.weight, 0.0, GATE_STD)
        moe.gate.expert_bias.zero_()


@torch.no_grad()
def update_expert_bias(
    model: LLaDA2MoeModelLM, rate: float, dp: DataParallel = DataParallel()
) -> torch.Tensor:
    """Aux-loss-free balancing: raise the bias of under-loaded experts, lower over-loaded ones, by the loads of the
    whole (global) batch, summed over ``dp``'s processes. Returns the mean over layers of max load / mean load
    (1 = perfectly balanced), a 0-d tensor (no sync)."""
    moes = model.moe_layers()
    load = dp.sum_(torch.stack([moe.last_load for moe in moes])).float()  # [layers, experts]
    mean = load.mean(1, keepdim=True)
    for moe, step in zip(moes, torch.sign(mean - load)):
        moe.gate.expert_bias += rate * step
    return (load.max(1).values / mean.squeeze(1).clamp(min=1e-9)).mean()


def training_model(
    cfg: LLaDA2Config, device: str, compile: bool = False, capacity_factor: float | None = CAPACITY_FACTOR
) -> LLaDA2MoeModelLM:
    """A freshly initialised model on ``device`` in training form: experts fused into stacked parameters, the
    padded path's capacity set (``None``: no row dropped), and its decoder layers compiled if asked."""
    model = LLaDA2MoeModelLM(cfg)
    init_weights(model)
    model.to(device).train()
    for moe in model.moe_layers():
        moe.capacity_factor = capacity_factor
        moe.fuse_experts()
    if compile:
        model.compile_layers()
    return model


def optimizer(model: LLaDA2MoeModelLM, lr: float, device: str) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (fused kernels on a GPU)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": other, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
        fused=device.startswith("cuda"),
    )


def autocast_for(device: str):
    """The training step's autocast: bf16 on a GPU (where the MoE runs as grouped GEMMs), none on a CPU."""
    if device.startswith("cuda"):
        return lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    return lambda: torch.autocast("cpu", enabled=False)


def train_step(
    model,
    opt,
    x0: torch.Tensor,
    block: int,
    gen: torch.Generator,
    mask: torch.Tensor,
    amp,
    dp: DataParallel = DataParallel(),
    forward=None,
    confidence_weight: float = 0.0,
) -> dict:
    """One optimiser step of the block-diffusion objective on ``x0``, this process's shard of the step's batch
    (then the router-bias update); returns this shard's loss and objective statistics, the gradient norm and the
    load imbalance, all tensors (no sync). ``forward`` is ``dp.training_forward(model)`` (default: the model's own)."""
    with amp():
        loss, st = diffusion_loss(
            forward or model.forward_masked, x0, block, MASK, gen, mask, dp.shard, confidence_weight
        )
    opt.zero_grad(set_to_none=True)
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return {
        "loss": loss.detach(),
        **st,
        "grad_norm": gnorm,
        "imbalance": update_expert_bias(model, BIAS_RATE, dp),
    }


def lr_at(step: int, total: int, peak: float) -> float:
    if step < WARMUP:
        return peak * (step + 1) / WARMUP
    frac = min(1.0, (step - WARMUP) / max(1, total - WARMUP))
    return peak * (LR_FLOOR + (1 - LR_FLOOR) * 0.5 * (1 + math.cos(math.pi * frac)))


def block_at(step: int, total: int, block: int, stages=()) -> int:
    """Block length of step ``step`` of ``total``: each stage ``(block length, until)`` in turn for the steps before
    ``until * total``, then ``block``. ``((1, 0.2),)`` trains the first 20% of the steps autoregressively (blocks of
    one token); ``((1, 0.1), (4, 0.2))`` then blocks of 4, as LLaDA2.0 grew its block size from an AR model's."""
    for b, until in stages:
        if step < until * total:
            return b
    return block


def parse_block_stages(text: str, seq_len: int) -> tuple:
    """``"1:0.1,4:0.2"`` -> ``((1, 0.1), (4, 0.2))``: block lengths that divide ``seq_len``, each until a fraction
    of the steps, the fractions increasing in (0, 1). Raises ``ValueError`` naming what is wrong."""
    stages = []
    for item in text.split(","):
        b, sep, f = item.partition(":")
        try:
            b, f = int(b), float(f)
        except ValueError:
            raise ValueError(f"stage {item!r}: needs BLOCK:FRACTION, e.g. 4:0.2") from None
        if not sep or b < 1 or seq_len % b:
            raise ValueError(
                f"stage {item!r}: the block length must be >= 1 and divide the sequence length {seq_len}"
            )
        if not 0 < f < 1 or (stages and f <= stages[-1][1]):
            raise ValueError(f"stage {item!r}: the fractions must increase within (0, 1)")
        stages.append((b, f))
    return tuple(stages)
