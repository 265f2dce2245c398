"""Semi-autoregressive block-diffusion decoding as dInfer does it for LLaDA2 (llada2.md §2-3).

Prefill over the prompt blocks before the first decode block; then, block by block: denoising
forwards over the block's positions that unmask every masked position whose confidence (max softmax
probability) reaches ``threshold`` (at least the most confident one), and one commit forward once no
mask is left; stop after a block containing EOS. Every forward reports to ``on_forward`` what the
trace format records: phase, block, rows, their routing (captured from the MoE gates), confidence,
which rows were masked and which this forward unmasked.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from traces.model.modeling import LLaDA2MoeModelLM
from traces.schema import COMMIT, DENOISE, PREFILL


@dataclass
class ForwardRecord:
    """One forward of the decoder, as the collector writes it."""

    phase: int
    block: int
    step_in_block: int
    kv_len: int
    ids: torch.Tensor  # [T, L_moe, k]
    weights: torch.Tensor  # [T, L_moe, k]
    confidence: torch.Tensor  # [T]
    was_masked: torch.Tensor  # [T] bool
    decoded: torch.Tensor  # [T] bool


class RoutingCapture:
    """Hooks every MoE gate of a model; ``take()`` returns the last forward's routing [T, L, k]."""

    def __init__(self, model: LLaDA2MoeModelLM):
        self.layers = model.moe_layers()
        self.buf = []
        for moe in self.layers:
            moe.router_hook = lambda idx, w: self.buf.append((idx.detach(), w.detach()))

    def take(self):
        ids = torch.stack([i for i, _ in self.buf], 1)
        w = torch.stack([w for _, w in self.buf], 1)
        self.buf = []
        return ids, w

    def remove(self):
        for moe in self.layers:
            moe.router_hook = None


@torch.no_grad()
def generate(model: LLaDA2MoeModelLM, prompt: list[int], max_new_tokens: int, block_length: int = 16,
             threshold: float = 0.9, on_forward=None, before_forward=None) -> list[int]:
    """Decode one prompt; returns the generated token ids (EOS and after dropped).

    ``before_forward(phase, block, step_in_block, masked)`` is called before each forward with what is
    known then (``masked`` [T] bool: the rows that are mask tokens in its input); ``on_forward``
    after it with its :class:`ForwardRecord`."""
    c = model.config
    dev = next(model.parameters()).device
    B, P = block_length, len(prompt)
    total = -(-(P + max_new_tokens) // B) * B
    x = torch.full((1, total), c.mask_token_id, dtype=torch.long, device=dev)
    x[0, :P] = torch.tensor(prompt, device=dev)
    first = (P // B) * B
    cache = model.new_cache(1, total, B)
    cap = RoutingCapture(model)
    try:
        if first > 0:  # prefill the whole prompt blocks
            if before_forward:
                before_forward(PREFILL, 0, 0, torch.zeros(first, dtype=torch.bool, device=dev))
            logits = model(x[:, :first], start=0, cache=cache)
            ids, w = cap.take()
            if on_forward:
                p = torch.softmax(logits[0], -1)
                on_forward(ForwardRecord(PREFILL, 0, 0, 0, ids, w, torch.full((first,), float("nan"), device=dev),
                                         torch.zeros(first, dtype=torch.bool, device=dev),
                                         torch.zeros(first, dtype=torch.bool, device=dev)))
        for start in range(first, total, B):
            blk, j = start // B, 0
            while True:
                seg = x[:, start:start + B]
                masked = seg[0] == c.mask_token_id
                if before_forward:
                    before_forward(DENOISE if masked.any() else COMMIT, blk, j, masked)
                logits = model(seg, start=start, cache=cache)
                ids, w = cap.take()
                p = torch.softmax(logits[0], -1)
                conf, x0 = p.max(-1)
                if not masked.any():  # commit forward: the finished block rewrites its KV entries
                    if on_forward:
                        on_forward(ForwardRecord(COMMIT, blk, j, start, ids, w, conf, masked, torch.zeros_like(masked)))
                    break
                eligible = masked & (x0 != c.mask_token_id)
                cand = torch.where(eligible, conf, torch.full_like(conf, float("-inf")))
                if not eligible.any():  # every masked position predicts the mask: take the best non-mask
                    alt = p.clone()
                    alt[:, c.mask_token_id] = 0
                    conf2, x0 = alt.max(-1)
                    eligible = masked
                    cand = torch.where(masked, conf2, torch.full_like(conf2, float("-inf")))
                thr = min(threshold, float(cand.max()) - 1e-5)
                take = eligible & (cand >= thr)
                seg[0, take] = x0[take]
                if on_forward:
                    on_forward(ForwardRecord(DENOISE, blk, j, start, ids, w, conf, masked, take))
                j += 1
            if (x[0, start:start + B] == c.eos_token_id).any() and start + B > P:
                break
    finally:
        cap.remove()
    out = x[0, P:].tolist()
    return [t for t in out if t != c.eos_token_id and t != c.mask_token_id]
