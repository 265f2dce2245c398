"""The masked block-diffusion objective (LLaDA2 / BD3-LM style) for one batch of clean sequences.

A sequence of L tokens is split into blocks of ``block`` tokens. The model sees 2L rows: a noisy copy
(each block masked independently with probability t_b ~ U(t_min, 1)) followed by the clean copy, both
at positions 0..L-1. A noisy row attends to its own noisy block (bidirectionally) and to the clean
blocks before it; a clean row attends block-causally to the clean copy. This is exactly what block
decoding sees: a partly masked current block over a KV cache of finished blocks. The loss is the
cross-entropy on masked rows weighted by 1/t_b, divided by the number of rows (the LLaDA ELBO). With
blocks of one token it is autoregressive next-token prediction (see ``noise``). ``confidence_weight`` adds
LLaDA2.0's confidence-aware parallel (CAP) term: the entropy of the predicted distribution at the masked rows the
model already predicts correctly, divided by the number of rows, so that correct predictions grow confident (more
tokens pass the decoding threshold in one forward) without pushing the uncertain ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dllm_offload_sim.models.llada2.train.shard import Shard


ATTENTIONS = ("sdpa", "flex")  # how the training step computes attention under the block-diffusion mask


def may_attend(q: torch.Tensor, kv: torch.Tensor, length: int, block: int) -> torch.Tensor:
    """Whether row ``q`` may attend to row ``kv`` of [noisy | clean] (row indices, broadcast): a noisy row to its own
    noisy block and the clean blocks before it, a clean row block-causally to the clean copy."""
    qc, kc = q >= length, kv >= length
    qb, kb = (q % length) // block, (kv % length) // block
    return (~qc & ((~kc & (kb == qb)) | (kc & (kb < qb)))) | (qc & kc & (kb <= qb))


def block_diffusion_mask(length: int, block: int, device=None) -> torch.Tensor:
    """Boolean [2L, 2L] attention mask (True = may attend) over [noisy | clean] rows."""
    i = torch.arange(2 * length, device=device)
    return may_attend(i[:, None], i[None, :], length, block)


@dataclass(frozen=True)
class FlexMask:
    """The block-diffusion mask for FlexAttention: its block mask (the tiles with nothing to attend are skipped, half
    of them at 128 x 128 tiles) and the attention function that reads it (compiled, except on a CPU)."""

    block_mask: object
    attend: object


def attention_mask(length: int, block: int, device, attention: str = "sdpa"):
    """The block-diffusion mask as the training step's attention takes it: ``sdpa``, the boolean [2L, 2L] tensor;
    ``flex``, a :class:`FlexMask` (FlexAttention has no backward on a CPU, so training with it needs a GPU)."""
    if attention == "sdpa":
        return block_diffusion_mask(length, block, device)
    if attention != "flex":
        raise ValueError(f"attention={attention!r}: expected one of {', '.join(ATTENTIONS)}")
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    bm = create_block_mask(
        lambda b, h, q, kv: may_attend(q, kv, length, block),
        None,
        None,
        2 * length,
        2 * length,
        device=device,
    )
    cuda = torch.device(device).type == "cuda"
    return FlexMask(bm, torch.compile(flex_attention, dynamic=False) if cuda else flex_attention)


def noise(
    x0: torch.Tensor,
    block: int,
    mask_id: int,
    gen: torch.Generator,
    t_min: float = 1e-3,
    shard: Shard = Shard(),
):
    """Mask ``x0`` [B, L] block-wise; returns (noisy ids, masked [B, L] bool, t per row [B, L]). Blocks of one
    token are always masked (t = 1): an unmasked one-token block has nothing left to predict, and the fully masked
    one is next-token prediction from the clean prefix, the autoregressive objective. In a data-parallel run
    ``x0`` is ``shard``'s rows of the global batch, and the noise is drawn for the global batch and sliced the same
    way (every process's ``gen`` has the same seed)."""
    B, L = x0.shape
    nb = L // block
    if block == 1:
        t_min = 1.0
    rows = shard.rows(B)
    t = t_min + (1 - t_min) * torch.rand(B * shard.world, nb, generator=gen, device=x0.device)[rows]
    t = t.repeat_interleave(block, 1)
    masked = torch.rand(B * shard.world, L, generator=gen, device=x0.device)[rows] < t
    return torch.where(masked, torch.full_like(x0, mask_id), x0), masked, t


def diffusion_loss(
    forward,
    x0: torch.Tensor,
    block: int,
    mask_id: int,
    gen: torch.Generator,
    attn_mask: torch.Tensor | None = None,
    shard: Shard = Shard(),
    confidence_weight: float = 0.0,
) -> tuple[torch.Tensor, dict]:
    """The objective on clean batch ``x0`` [B, L] through ``forward`` (a model's ``forward_masked``, or its
    data-parallel wrapper); returns (loss, stats as 0-d tensors: masked accuracy, masked NLL, mask rate, and with a
    ``confidence_weight`` the CAP term), tensors so that a training loop syncs only when it logs. The loss is
    normalised by this batch's rows, so the mean of the shards' losses is the global batch's."""
    B, L = x0.shape
    if L % block:
        raise ValueError(f"sequence length {L} is not a multiple of the block length {block}")
    xt, masked, t = noise(x0, block, mask_id, gen, shard=shard)
    ids = torch.cat([xt, x0], 1)
    pos = torch.arange(L, device=x0.device).repeat(2)
    if attn_mask is None:
        attn_mask = block_diffusion_mask(L, block, x0.device)
    logits = forward(ids, pos, attn_mask, rows=L)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x0.reshape(-1), reduction="none").view(B, L)
    loss = (ce * masked / t).sum() / (B * L)
    correct = (logits.argmax(-1) == x0) & masked
    stats = {}
    if confidence_weight:
        logp = F.log_softmax(logits.float(), -1)
        entropy = -(logp.exp() * logp).sum(-1)  # [B, L]
        conf = (entropy * correct).sum() / (B * L)
        loss = loss + confidence_weight * conf
        stats["confidence_loss"] = conf.detach()
    with torch.no_grad():
        n = masked.sum().clamp(min=1)
        acc = correct.sum() / n
        nll = (ce * masked).sum() / n
    return loss, {"masked_acc": acc, "masked_nll": nll, "mask_rate": masked.float().mean(), **stats}
