"""Grouped expert compute: every (token, expert) pair of a layer in one grouped call.

A ``RoutingPlan`` sorts the (token, expert) pairs that run on the GPU by slot; ``grouped_ffn`` then
computes ``sum_k w_tk * FFN_{e_tk}(x_t)`` for all of them. Backends:

* ``grouped_mm``: ``torch._grouped_mm`` over the whole slot arena (CUDA, bf16): two grouped GEMMs,
  no weight copies, empty groups for idle slots;
* ``bmm``: gathers the used slots' weights and pads tokens per expert to a batch (any device);
* ``loop``: one FFN per expert, launched from Python (the baseline the grouped call replaces).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F


@dataclass
class RoutingPlan:
    """The (token, slot, weight) pairs to compute, sorted by slot."""

    token: torch.Tensor  # [P] int64 token row of each pair
    slot: torch.Tensor  # [P] int64 slot of each pair (sorted ascending)
    weight: torch.Tensor  # [P] gate weight of each pair
    slots: torch.Tensor  # [G] distinct slots used, ascending
    counts: torch.Tensor  # [G] pairs per used slot
    n_slots: int  # arena size (for grouped_mm offsets)
    offs: torch.Tensor  # [n_slots] int32 cumulative pairs per arena slot (grouped_mm group ends)
    # [(first slot, last slot + 1, first pair, last pair + 1, offs)] of <= MAX_GROUPS slots
    windows: list | None = None
    pair: torch.Tensor | None = None  # [P] int64 flat routing position ``t * k + j`` of each pair

    @property
    def n_pairs(self) -> int:
        return int(self.token.shape[0])


def routing_plan(
    ids: torch.Tensor, weights: torch.Tensor, slot_lut: torch.Tensor, n_slots: int
) -> RoutingPlan:
    """Pairs of ``ids [T, k]`` whose expert has a slot in ``slot_lut [E]`` (-1 = not on the GPU)."""
    T, k = ids.shape
    slot = slot_lut[ids.reshape(-1)]
    keep = slot >= 0
    flat = torch.arange(T * k, device=ids.device)[keep]
    slot, w = slot[keep], weights.reshape(-1)[keep]
    order = torch.argsort(slot, stable=True)
    flat, slot, w = flat[order], slot[order], w[order]
    tok = flat // k
    slots, counts = torch.unique_consecutive(slot, return_counts=True)
    per_slot = torch.zeros(n_slots, dtype=torch.int64, device=ids.device)
    per_slot[slots] = counts
    offs = torch.cumsum(per_slot, 0).to(torch.int32)
    return RoutingPlan(tok, slot, w, slots, counts, n_slots, offs, pair=flat)


MAX_GROUPS = 512  # groups per grouped GEMM (torch._grouped_mm refuses 1024 and more)


def _window_bounds(slots: np.ndarray, counts: np.ndarray):
    """Split used slots (ascending) into windows spanning at most MAX_GROUPS arena slots."""
    out, start = [], 0
    pair0 = 0
    while start < len(slots):
        lo = int(slots[start])
        end = int(np.searchsorted(slots, lo + MAX_GROUPS, side="left"))
        hi = int(slots[end - 1]) + 1
        n = int(counts[start:end].sum())
        per = np.zeros(hi - lo, np.int64)
        per[slots[start:end] - lo] = counts[start:end]
        out.append((lo, hi, pair0, pair0 + n, np.cumsum(per).astype(np.int32)))
        pair0 += n
        start = end
    return out


def _windows(plan: "RoutingPlan"):
    wins = _window_bounds(plan.slots.cpu().numpy(), plan.counts.cpu().numpy())
    return [(lo, hi, a, b, torch.from_numpy(o).to(plan.token.device)) for lo, hi, a, b, o in wins]


def _ffn(x, w13, w2):
    h = x @ w13.t()
    i = w2.shape[1]
    return (F.silu(h[:, :i]) * h[:, i:]) @ w2.t()


def grouped_ffn(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    plan: RoutingPlan,
    backend: str = "auto",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Add ``sum_pairs weight * FFN_slot(x[token])`` into ``out`` (``[T, H]``, zeros if None)."""
    if out is None:
        out = torch.zeros_like(x)
    if plan.n_pairs == 0:
        return out
    y = pair_outputs(x, w13, w2, plan, backend)
    w = plan.weight if plan.weight.dtype == y.dtype else plan.weight.to(y.dtype)
    if y.dtype != out.dtype:
        y = y.to(out.dtype)
    out.index_add_(0, plan.token, y * w[:, None])
    return out


def pair_outputs(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, plan: RoutingPlan, backend: str = "auto"
) -> torch.Tensor:
    """``FFN_slot(x[token])`` of every pair of ``plan`` (``[P, H]``, unweighted, in plan order)."""
    if backend == "auto":
        backend = (
            "grouped_mm"
            if x.is_cuda and hasattr(torch, "_grouped_mm") and x.dtype == torch.bfloat16
            else "bmm"
        )
    xs = x[plan.token]
    if backend == "loop":
        y = torch.empty_like(xs)
        start = 0
        for s, c in zip(plan.slots.tolist(), plan.counts.tolist()):
            y[start : start + c] = _ffn(xs[start : start + c], w13[s], w2[s])
            start += c
    elif backend == "grouped_mm":  # one pair of grouped GEMMs per window of <= MAX_GROUPS arena slots
        i = w2.shape[2]
        parts = []
        for lo, hi, p0, p1, offs in plan.windows or _windows(plan):
            h = torch._grouped_mm(xs[p0:p1], w13[lo:hi].transpose(1, 2), offs=offs)
            parts.append(torch._grouped_mm(F.silu(h[:, :i]) * h[:, i:], w2[lo:hi].transpose(1, 2), offs=offs))
        y = parts[0] if len(parts) == 1 else torch.cat(parts)
    elif backend == "bmm":
        G, m = len(plan.slots), int(plan.counts.max())
        starts = torch.cumsum(plan.counts, 0) - plan.counts
        pos = torch.arange(plan.n_pairs, device=x.device) - torch.repeat_interleave(starts, plan.counts)
        grp = torch.repeat_interleave(torch.arange(G, device=x.device), plan.counts)
        xb = x.new_zeros((G, m, x.shape[1]))
        xb[grp, pos] = xs
        h = torch.bmm(xb, w13[plan.slots].transpose(1, 2))
        i = w2.shape[2]
        yb = torch.bmm(F.silu(h[..., :i]) * h[..., i:], w2[plan.slots].transpose(1, 2))
        y = yb[grp, pos]
    else:
        raise ValueError(f"unknown grouped backend {backend!r}; use auto, grouped_mm, bmm or loop")
    return y


def packed_offsets(sizes: list) -> tuple[list, int]:
    """Byte offsets of buffers of ``sizes`` bytes packed one after another, each 8-byte aligned, and the
    packed total (at least 8): the layout of :func:`_packed_host`."""
    offs, n = [], 0
    for size in sizes:
        offs.append(n)
        n += -(-size // 8) * 8
    return offs, max(n, 8)


def _packed_host(arrays: list, pin: bool) -> torch.Tensor:
    """``arrays`` packed into one host byte buffer at :func:`packed_offsets` (pinned if ``pin``, so that
    a copy from it is asynchronous)."""
    offs, n = packed_offsets([a.nbytes for a in arrays])
    buf = torch.empty(n, dtype=torch.uint8, pin_memory=pin)
    pack_into(buf.numpy(), arrays, offs)
    return buf


def pack_into(host: np.ndarray, arrays: list, offs: list) -> None:
    """Write ``arrays`` into the byte buffer ``host`` (uint8) at the byte offsets ``offs``."""
    for a, o in zip(arrays, offs):
        host[o : o + a.nbytes] = np.ascontiguousarray(a).view(np.uint8).reshape(-1)


def _packed_upload(arrays: list, device) -> list:
    """Copy host ``arrays`` to ``device`` as one transfer; returns the device tensors in order.

    On CUDA the arrays are packed (:func:`_packed_host`) into one pinned buffer and sent with one
    asynchronous copy on the current stream: the host does not wait and, unlike a copy from pageable
    memory, does not queue behind the expert copies already on the copy engine.
    Torch's pinned allocator keeps the buffer until the copy has run.
    """
    dev = torch.device(device)
    if dev.type != "cuda":
        return [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
    d = _packed_host(arrays, pin=True).to(dev, non_blocking=True)
    offs, _ = packed_offsets([a.nbytes for a in arrays])
    return [d[o : o + a.nbytes].view(_TORCH_DTYPE[a.dtype]) for a, o in zip(arrays, offs)]


_TORCH_DTYPE = {
    np.dtype(np.int64): torch.int64,
    np.dtype(np.int32): torch.int32,
    np.dtype(np.float32): torch.float32,
}


def plan_from_numpy(
    ids: np.ndarray, weights: np.ndarray, slot_lut: np.ndarray, n_slots: int, device
) -> RoutingPlan:
    """:func:`routing_plan` computed on the host from numpy routing (what the runtime has at hand after
    the gate's ids come back), uploaded in one asynchronous copy (:func:`_packed_upload`)."""
    T, k = ids.shape
    slot = slot_lut[ids.reshape(-1)]
    keep = np.flatnonzero(slot >= 0)
    order = keep[np.argsort(slot[keep], kind="stable")]
    tok = (order // k).astype(np.int64)
    pair = order.astype(np.int64)
    sl = slot[order].astype(np.int64)
    w = np.asarray(weights, np.float32).reshape(-1)[order]
    slots, counts = np.unique(sl, return_counts=True)
    per_slot = np.zeros(n_slots, np.int64)
    per_slot[slots] = counts
    offs = np.cumsum(per_slot).astype(np.int32)
    bounds = _window_bounds(slots, counts)
    up = _packed_upload(
        [
            np.concatenate([tok, sl, pair]),
            w,
            slots.astype(np.int64),
            counts.astype(np.int64),
            offs,
            *(o for *_, o in bounds),
        ],
        device,
    )
    P = len(order)
    idx, w_d, slots_d, counts_d, offs_d = up[:5]
    wins = [(lo, hi, a, b, o) for (lo, hi, a, b, _), o in zip(bounds, up[5:])]
    return RoutingPlan(
        idx[:P], idx[P : 2 * P], w_d, slots_d, counts_d, n_slots, offs_d, wins, pair=idx[2 * P :]
    )
