"""Semi-autoregressive block-diffusion decoding as dInfer does it for LLaDA2.

A counted prefill forward over ``max(floor(P/B) * B, B)`` tokens (the whole prompt blocks, or the first
block when the prompt is shorter than one); then, block by block, denoising forwards over the block's
positions that unmask every masked position whose confidence (max softmax probability) reaches
``threshold`` (at least the most confident one). With ``unroll`` (dInfer's default) the forwards run in
groups of ``max(min(masks // 8, 4), 2)`` between mask checks, so a block finished inside a group gets
its remaining forwards over no mask, and those take the commit forward's place; the commit forward (the
finished block rewriting its KV entries) runs only when the group's last forward still had a mask.
Without ``unroll``, one forward per check and always one commit forward. Stop after a block holding EOS.
Every forward reports to ``on_forward`` what the trace format records: phase, block, rows, their routing
(captured from the MoE gates), confidence, which rows were masked and which this forward unmasked.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm_offload_sim.models.llada2.config import CheckpointError
from dllm_offload_sim.models.llada2.modeling import LLaDA2MoeModelLM
from dllm_offload_sim.traces.schema import COMMIT, DENOISE, PREFILL


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


def unmask(row, masked, p, conf, x0, threshold: float, mask_id: int):
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
def generate(
    model: LLaDA2MoeModelLM,
    prompt: list[int],
    max_new_tokens: int,
    block_length: int = 16,
    threshold: float = 0.9,
    on_forward=None,
    before_forward=None,
    unroll: bool = True,
) -> list[int]:
    """Decode one prompt; returns the generated token ids (EOS and after dropped).

    ``before_forward(phase, block, step_in_block, masked)`` is called before each forward with what is
    known then (``masked`` [T] bool: the rows that are mask tokens in its input); ``on_forward``
    after it with its :class:`ForwardRecord`."""
    return generate_batch(
        model,
        [prompt],
        max_new_tokens,
        block_length,
        threshold,
        unroll=unroll,
        on_forward=None if on_forward is None else (lambda b, rec: on_forward(rec)),
        before_forward=None
        if before_forward is None
        else (lambda ph, blk, j, masked: before_forward(ph, blk, j, masked[0])),
    )[0]


UNROLL_EXPECTED_TPF, UNROLL_MAX, UNROLL_MIN = 8, 4, 2  # dInfer's BlockDiffusionRunner defaults


def unroll_forwards(masks: int, unroll: bool = True) -> int:
    """Forwards run before the next mask check when ``masks`` positions of the block are masked."""
    return max(min(masks // UNROLL_EXPECTED_TPF, UNROLL_MAX), UNROLL_MIN) if unroll else 1


@torch.no_grad()
def generate_batch(
    model: LLaDA2MoeModelLM,
    prompts: list[list[int]],
    max_new_tokens: int,
    block_length: int = 16,
    threshold: float = 0.9,
    on_forward=None,
    before_forward=None,
    unroll: bool = True,
) -> list[list[int]]:
    """Decode ``prompts`` in lockstep (synchronous batched decoding); returns each one's tokens.

    Prompts are left-padded to the longest, so the batch shares block boundaries; pad positions are
    never attended to and each prompt's RoPE positions start at 0 (``cache["pad"]``). Prompts whose lengths
    differ by other than whole blocks are refused: their blocks would not start where they start when the
    prompt is decoded alone, and so neither would its tokens. Every forward
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
    if any(p % B for p in pads):
        raise ValueError(
            f"batched decoding needs prompt lengths that differ by whole blocks of {B} tokens, got "
            f"{lens}; each would decode other tokens than alone (decode them in separate batches)"
        )
    total = -(-(P + max_new_tokens) // B) * B
    x = torch.full((n, total), c.mask_token_id, dtype=torch.long, device=dev)
    for b, q in enumerate(prompts):
        x[b, : pads[b]] = c.pad_token_id
        x[b, pads[b] : P] = torch.tensor(q, dtype=torch.long, device=dev)
    first = (P // B) * B  # the first decode block starts here
    prefill = max(first, B)  # dInfer prefills the first block when the prompt is shorter than one
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
                on_forward(
                    b,
                    ForwardRecord(
                        phase,
                        blk,
                        j,
                        max(0, start - pads[b]) if phase != PREFILL else 0,
                        ids[b, lo:],
                        w[b, lo:],
                        conf[b, lo:],
                        masked[b, lo:],
                        took[b, lo:],
                    ),
                )

    try:
        none = torch.zeros((n, prefill), dtype=torch.bool, device=dev)  # (as the trace records a prefill)
        if before_forward:
            before_forward(PREFILL, 0, 0, none)
        model(x[:, :prefill], start=0, cache=cache)
        ids, w = cap.take()
        report(
            PREFILL, 0, 0, 0, prefill, ids, w, torch.full((n, prefill), float("nan"), device=dev), none, none
        )

        def step(start, blk, j):
            """One forward over the block at ``start``; returns whether its input still had a mask."""
            seg = x[:, start : start + B]
            masked = seg == c.mask_token_id
            if before_forward:
                before_forward(DENOISE if masked.any() else COMMIT, blk, j, masked)
            logits = model(seg, start=start, cache=cache)
            ids, w = cap.take()
            if not torch.isfinite(logits).all():
                raise CheckpointError(
                    f"block {blk}, step {j}: the model's logits are not finite (NaN or inf); "
                    f"the checkpoint's weights (router, experts or attention) hold NaN or inf "
                    f"values, so decoding cannot go on"
                )
            p = torch.softmax(logits, -1)
            conf, x0 = p.max(-1)
            if not masked.any():  # a forward over the finished block: it rewrites the block's KV entries
                report(COMMIT, blk, j, start, B, ids, w, conf, masked, torch.zeros_like(masked))
                return False
            took = torch.zeros_like(masked)
            for b in range(n):
                if masked[b].any():
                    took[b] = unmask(seg[b], masked[b], p[b], conf[b], x0[b], threshold, c.mask_token_id)
            report(DENOISE, blk, j, start, B, ids, w, conf, masked, took)
            return True

        for start in range(first, total, B):
            blk, j, last_had_mask = start // B, 0, False
            while (masks := int((x[:, start : start + B] == c.mask_token_id).sum())) > 0:
                if j > B * UNROLL_MAX:  # every denoising forward unmasks at least one position of each row
                    raise RuntimeError(f"block {blk}: still masked after {j} forwards of a {B}-token block")
                for _ in range(unroll_forwards(masks, unroll)):
                    last_had_mask = step(start, blk, j)
                    j += 1
            if last_had_mask or j == 0:  # the commit forward, unless a no-mask forward already took its place
                step(start, blk, j)
            for b in range(n):
                if live[b] and (x[b, start : start + B] == c.eos_token_id).any() and start + B > P:
                    live[b] = False
                    x[b, start + B :] = c.eos_token_id  # nothing left to decode for a finished row
            if not any(live):
                break
    finally:
        cap.remove()
    outs = []
    for b in range(n):
        out = x[b, P:].tolist()
        outs.append([t for t in out if t != c.eos_token_id and t != c.mask_token_id])
    return outs
