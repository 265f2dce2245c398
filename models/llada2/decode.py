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

from models.llada2.config import CheckpointError
from models.llada2.modeling import LLaDA2MoeModelLM
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


def _unmask(row, masked, p, conf, x0, threshold: float, mask_id: int):
    """dInfer's threshold rule for one row of a block: every masked position whose confidence reaches
    ``threshold``, at least the most confident one; returns the positions unmasked (and writes them)."""
    eligible = masked & (x0 != mask_id)
    cand = torch.where(eligible, conf, torch.full_like(conf, float("-inf")))
    if not eligible.any():  # every masked position predicts the mask: take the best non-mask
        alt = p.clone()
        alt[:, mask_id] = 0
        conf2, x0 = alt.max(-1)
        eligible = masked
        cand = torch.where(masked, conf2, torch.full_like(conf2, float("-inf")))
    thr = min(threshold, float(cand.max()) - 1e-5)
    take = eligible & (cand >= thr)
    row[take] = x0[take]
    return take


@torch.no_grad()
def generate(model: LLaDA2MoeModelLM, prompt: list[int], max_new_tokens: int, block_length: int = 16,
             threshold: float = 0.9, on_forward=None, before_forward=None) -> list[int]:
    """Decode one prompt; returns the generated token ids (EOS and after dropped).

    ``before_forward(phase, block, step_in_block, masked)`` is called before each forward with what is
    known then (``masked`` [T] bool: the rows that are mask tokens in its input); ``on_forward``
    after it with its :class:`ForwardRecord`."""
    return generate_batch(model, [prompt], max_new_tokens, block_length, threshold,
                          on_forward=None if on_forward is None else (lambda b, rec: on_forward(rec)),
                          before_forward=None if before_forward is None else
                          (lambda ph, blk, j, masked: before_forward(ph, blk, j, masked[0])))[0]


@torch.no_grad()
def generate_batch(model: LLaDA2MoeModelLM, prompts: list[list[int]], max_new_tokens: int, block_length: int = 16,
                   threshold: float = 0.9, on_forward=None, before_forward=None) -> list[list[int]]:
    """Decode ``prompts`` in lockstep (synchronous batched decoding); returns each one's tokens.

    Prompts are left-padded to the longest, so the batch shares block boundaries; pad positions are
    never attended to and each prompt's RoPE positions start at 0 (``cache["pad"]``). Every forward
    runs over the whole batch; the threshold rule applies per row, and the commit forward comes once
    no row has a mask left in the block. A row whose block holds EOS is finished: its later positions
    become EOS and it is no longer reported. ``on_forward(b, record)`` reports each live row's part of
    a forward (its real rows only); ``before_forward(phase, block, step_in_block, masked [n, T])``.
    """
    c = model.config
    dev = next(model.parameters()).device
    B, n = block_length, len(prompts)
    lens = [len(q) for q in prompts]
    P = max(lens)
    pads = [P - m for m in lens]
    total = -(-(P + max_new_tokens) // B) * B
    x = torch.full((n, total), c.mask_token_id, dtype=torch.long, device=dev)
    for b, q in enumerate(prompts):
        x[b, :pads[b]] = c.pad_token_id
        x[b, pads[b]:P] = torch.tensor(q, dtype=torch.long, device=dev)
    first = (P // B) * B
    cache = model.new_cache(n, total, B)
    if any(pads):
        cache["pad"] = torch.tensor(pads, device=dev)
    live = [True] * n
    cap = RoutingCapture(model)

    def report(phase, blk, j, start, T, ids, w, conf, masked, took):
        if on_forward is None:
            return
        ids, w = ids.view(n, T, *ids.shape[1:]), w.view(n, T, *w.shape[1:])
        for b in range(n):
            lo = max(0, pads[b] - start)  # the row's real positions in this forward
            if live[b] and lo < T:
                on_forward(b, ForwardRecord(phase, blk, j, max(0, start - pads[b]) if phase != PREFILL else 0,
                                            ids[b, lo:], w[b, lo:], conf[b, lo:], masked[b, lo:], took[b, lo:]))

    try:
        if first > 0:  # prefill the whole prompt blocks
            none = torch.zeros((n, first), dtype=torch.bool, device=dev)
            if before_forward:
                before_forward(PREFILL, 0, 0, none)
            model(x[:, :first], start=0, cache=cache)
            ids, w = cap.take()
            report(PREFILL, 0, 0, 0, first, ids, w, torch.full((n, first), float("nan"), device=dev), none, none)
        for start in range(first, total, B):
            blk, j = start // B, 0
            while True:
                seg = x[:, start:start + B]
                masked = seg == c.mask_token_id
                if before_forward:
                    before_forward(DENOISE if masked.any() else COMMIT, blk, j, masked)
                logits = model(seg, start=start, cache=cache)
                ids, w = cap.take()
                if not torch.isfinite(logits).all():
                    raise CheckpointError(f"block {blk}, step {j}: the model's logits are not finite (NaN or inf); "
                                          f"the checkpoint's weights (router, experts or attention) hold NaN or inf "
                                          f"values, so decoding cannot go on")
                if j > B:  # every denoising step unmasks at least one position of each unfinished row
                    raise RuntimeError(f"block {blk}: still masked after {j} denoising steps of a {B}-token block")
                p = torch.softmax(logits, -1)
                conf, x0 = p.max(-1)
                if not masked.any():  # commit forward: the finished block rewrites its KV entries
                    report(COMMIT, blk, j, start, B, ids, w, conf, masked, torch.zeros_like(masked))
                    break
                took = torch.zeros_like(masked)
                for b in range(n):
                    if masked[b].any():
                        took[b] = _unmask(seg[b], masked[b], p[b], conf[b], x0[b], threshold, c.mask_token_id)
                report(DENOISE, blk, j, start, B, ids, w, conf, masked, took)
                j += 1
            for b in range(n):
                if live[b] and (x[b, start:start + B] == c.eos_token_id).any() and start + B > P:
                    live[b] = False
                    x[b, start + B:] = c.eos_token_id  # nothing left to decode for a finished row
            if not any(live):
                break
    finally:
        cap.remove()
    outs = []
    for b in range(n):
        out = x[b, P:].tolist()
        outs.append([t for t in out if t != c.eos_token_id and t != c.mask_token_id])
    return outs
