"""LLaDA2-MoE in PyTorch, module and parameter names as in the HF checkpoints (llada2.md §1-2).

``model.word_embeddings``, ``model.layers.{i}.{input_layernorm, post_attention_layernorm,
attention.query_key_value, attention.query_layernorm, attention.key_layernorm, attention.dense,
mlp.*}``, ``model.norm``, ``lm_head``. Attention is block-causal through a prefix KV cache: a
forward over positions [start, start + T) attends to the cache up to ``start`` and to itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from dllm_offload_sim.models.llada2.config import LLaDA2Config


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


class Attention(nn.Module):
    def __init__(self, c: LLaDA2Config):
        super().__init__()
        self.nh, self.nkv, self.hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.rot = int(self.hd * c.partial_rotary_factor)
        self.theta = c.rope_theta
        self.query_key_value = nn.Linear(c.hidden_size, (self.nh + 2 * self.nkv) * self.hd, bias=False)
        self.query_layernorm = RMSNorm(self.hd, c.rms_norm_eps)
        self.key_layernorm = RMSNorm(self.hd, c.rms_norm_eps)
        self.dense = nn.Linear(self.nh * self.hd, c.hidden_size, bias=False)

    def rope(self, x, pos):
        """Partial RoPE of ``x`` [B, heads, T, hd] at positions ``pos`` [T] (or [B, T], one row each)."""
        inv = self.theta ** (-torch.arange(0, self.rot, 2, device=x.device, dtype=torch.float32) / self.rot)
        f = pos.float()[..., None] * inv
        emb = torch.cat([f, f], -1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        if pos.dim() == 2:
            cos, sin = cos[:, None], sin[:, None]
        xr = x[..., : self.rot]
        return torch.cat([xr * cos + rotate_half(xr) * sin, x[..., self.rot :]], -1)

    def forward(self, x, start: int, cache: dict | None, layer: int):
        B, T, _ = x.shape
        qkv = self.query_key_value(x).view(B, T, self.nh + 2 * self.nkv, self.hd)
        q, k, v = (
            qkv[:, :, : self.nh],
            qkv[:, :, self.nh : self.nh + self.nkv],
            qkv[:, :, self.nh + self.nkv :],
        )
        q, k = self.query_layernorm(q), self.key_layernorm(k)
        pos = torch.arange(start, start + T, device=x.device)
        # [B] left padding of each row (batched decoding)
        pad = cache.get("pad") if cache is not None else None
        rpos = pos if pad is None else (pos[None, :] - pad[:, None]).clamp(min=0)
        q, k = self.rope(q.transpose(1, 2), rpos), self.rope(k.transpose(1, 2), rpos)  # [B, heads, T, hd]
        v = v.transpose(1, 2)
        if cache is not None:
            kc, vc = cache["k"][layer], cache["v"][layer]
            kc[:, :, start : start + T], vc[:, :, start : start + T] = k, v
            k, v = kc[:, :, : start + T], vc[:, :, : start + T]
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        mask = None  # one block over the cached prefix: exactly what the block-causal mask allows
        B_ = cache.get("block") if cache is not None else None
        if B_ and T > B_:  # several blocks at once (prefill): block-causal among them
            qb = torch.arange(start, start + T, device=x.device) // B_
            kb = torch.arange(0, start + T, device=x.device) // B_
            mask = kb[None, :] <= qb[:, None]
        if pad is not None:  # never attend to a row's pad positions (a pad query sees itself only)
            kidx = torch.arange(0, start + T, device=x.device)
            keep = (kidx[None, None, :] >= pad[:, None, None]) | (kidx[None, None, :] == pos[None, :, None])
            mask = (keep if mask is None else keep & mask[None])[:, None]  # [B, 1, T, S]
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.dense(a.transpose(1, 2).reshape(B, T, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Gate(nn.Module):
    """Sigmoid router with expert bias and group-limited top-k (llada2.md §1a)."""

    def __init__(self, c: LLaDA2Config):
        super().__init__()
        self.c = c
        self.weight = nn.Parameter(torch.empty(c.num_experts, c.hidden_size))
        self.register_buffer("expert_bias", torch.zeros(c.num_experts))

    def forward(self, x):  # x [N, H]
        c = self.c
        s = torch.sigmoid(x.float() @ self.weight.float().t())
        b = s + self.expert_bias.float()
        N = b.shape[0]
        g = b.view(N, c.n_group, -1)
        # each group's two best scores summed: its best, plus the best once that one is masked out (reductions, not a
        # top-k per group: ~1 M tiny top-k problems per training batch)
        top1, at = g.max(-1, keepdim=True)
        gs = top1.squeeze(-1) + g.scatter(-1, at, float("-inf")).amax(-1)
        keep = gs.topk(c.topk_group, dim=-1, sorted=False).indices  # a set: its order does not matter
        # the top-k among the kept groups' experts only (half the columns, no masked copy of the scores), mapped back
        per = c.num_experts // c.n_group
        kept = g.gather(1, keep.unsqueeze(-1).expand(-1, -1, per)).reshape(N, -1)
        top = kept.topk(c.num_experts_per_tok, dim=-1).indices
        idx = keep.gather(1, top // per) * per + top % per
        w = s.gather(1, idx)
        if c.norm_topk_prob:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return idx, w * c.routed_scaling_factor, s


def expert_counts(e: torch.Tensor, n_experts: int) -> torch.Tensor:
    """Rows routed to each of ``n_experts`` experts by the flat expert ids ``e``: ``bincount`` with a shape that does
    not depend on the data, so a compiled graph does not break at it."""
    return torch.zeros(n_experts, dtype=torch.int64, device=e.device).index_add_(0, e, torch.ones_like(e))


def experts_padded(flat, idx, w, gate_w, up_w, down_w, capacity: int | None = None):
    """Routed-expert output of ``flat`` [N, H]: rows grouped by expert into one padded batch.

    ``idx``/``w`` [N, k] are the routing; ``gate_w``/``up_w`` [E, I, H] and ``down_w`` [E, H, I] the
    stacked expert weights. Three batched matmuls instead of one small FFN per expert; differentiable
    (the training step uses it) and equal to the per-expert sum up to float rounding. ``capacity``
    (training only) bounds the rows per expert; the rows beyond it are dropped (GShard-style), which
    keeps memory bounded while the router is still unbalanced. Inference never drops.
    """
    N, k = idx.shape
    E = gate_w.shape[0]
    e = idx.reshape(-1)
    order = torch.argsort(e, stable=True)
    es = e[order]
    counts = expert_counts(es, E)
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.arange(es.numel(), device=flat.device) - starts[es]
    cap = int(counts.max())
    rows = order // k
    if capacity is not None and cap > capacity:
        keep = pos < capacity
        es, pos, rows, order, cap = es[keep], pos[keep], rows[keep], order[keep], capacity
    xp = flat.new_zeros(E, cap, flat.shape[1])
    xp[es, pos] = flat[rows]
    h = F.silu(torch.bmm(xp, gate_w.transpose(1, 2))) * torch.bmm(xp, up_w.transpose(1, 2))
    y = (torch.bmm(h, down_w.transpose(1, 2))[es, pos] * w.reshape(-1)[order, None]).to(flat.dtype)
    return flat.new_zeros(flat.shape).index_add_(0, rows, y)


def grouped_gemm_available(x: torch.Tensor) -> bool:
    """Whether ``experts_grouped`` runs for activations like ``x``: torch's grouped GEMM takes bf16 only, so ``x``
    is bf16 or a bf16 autocast region is active on its device (the training step's)."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    dev = x.device.type
    return x.dtype == torch.bfloat16 or (
        torch.is_autocast_enabled(dev) and torch.get_autocast_dtype(dev) == torch.bfloat16
    )


class _GatherRoutes(torch.autograd.Function):
    """Rows ``x[src // k]`` whose gradient is a gather too: ``inverse`` is ``src``'s inverse permutation, so the
    gradient of row ``n`` of ``x`` is the sum of its ``k`` copies' gradients, read at ``inverse[n * k: n * k + k]``.
    Plain indexing's backward scatters with atomic adds (or a sort) instead."""

    @staticmethod
    def forward(ctx, x, src, inverse, k: int):
        ctx.save_for_backward(inverse)
        ctx.k = k
        return x[src // k] if k > 1 else x[src]

    @staticmethod
    def backward(ctx, g):
        (inverse,) = ctx.saved_tensors
        k = ctx.k
        gx = g[inverse]
        if k > 1:
            gx = gx.view(-1, k, g.shape[-1]).sum(1)
        return gx, None, None, None


def gather_routes(x: torch.Tensor, src: torch.Tensor, inverse: torch.Tensor, k: int = 1) -> torch.Tensor:
    """``x[src // k]`` for a permutation ``src`` of ``x.shape[0] * k`` routes (``inverse`` its inverse), with a
    gather, not a scatter, for a backward: the MoE's dispatch (``k`` routes per token) and its return (``k`` = 1)."""
    return _GatherRoutes.apply(x, src, inverse, k)


@dataclass(frozen=True)
class SortedRoutes:
    """A layer's (token, expert) routes in expert order, from one sort: ``order`` (the route, ``token * k + j``, of each
    sorted row), ``back`` (its inverse: the sorted row of each route), ``counts`` (routes per expert) and ``offs``
    (int32 end of each expert's rows: a grouped GEMM's offsets)."""

    order: torch.Tensor
    back: torch.Tensor
    counts: torch.Tensor
    offs: torch.Tensor


def sort_routes(idx: torch.Tensor, n_experts: int) -> SortedRoutes:
    """:class:`SortedRoutes` of the routing ``idx`` [N, k]. The counts come from the sorted ids by binary search, not
    by adding ones at each id: compiled, a scatter-add over ~1 M routes into 256 counters ran as a sort-based index
    update that took 12 ms a call on an H200."""
    es, order = torch.sort(idx.reshape(-1).to(torch.int32), stable=True)
    bounds = torch.searchsorted(es, torch.arange(n_experts + 1, dtype=torch.int32, device=idx.device))
    back = torch.empty_like(order)
    back[order] = torch.arange(order.numel(), device=order.device)
    return SortedRoutes(order, back, bounds.diff(), bounds[1:].to(torch.int32))


def experts_grouped(flat, idx, w, gate_w, up_w, down_w, routes: SortedRoutes | None = None):
    """Routed-expert output of ``flat`` [N, H] as bf16 grouped GEMMs over its (token, expert) rows sorted by
    expert: one call per projection over every expert, no padding and no row dropped, differentiable, and
    deterministic (the rows go to and come back from expert order by gathers, forward and backward, each row is
    weighted before its down projection, and a token's routes are summed: no atomic adds). The same result
    as :func:`experts_padded` up to bf16 rounding, with memory that does not grow with the router's imbalance (the
    training step's MoE on a GPU). ``routes``: ``sort_routes(idx, E)`` if the caller has it."""
    N, k = idx.shape
    r = routes or sort_routes(idx, gate_w.shape[0])
    bf = torch.bfloat16
    xs = gather_routes(flat.to(bf), r.order, r.back, k)  # [N * k, H], expert by expert, cast before the copy
    inter = gate_w.shape[1]
    w13 = torch.cat([gate_w, up_w], 1).to(bf)  # [E, 2I, H]: gate and up in one grouped GEMM, xs read once
    gate, up = torch._grouped_mm(xs, w13.transpose(1, 2), offs=r.offs).split(inter, 1)
    # each row's routing weight applied before the down projection (it is linear), on the I-wide rows rather
    # than the H-wide outputs; then a token's k routes are a plain sum
    ws = gather_routes(w.reshape(-1, 1).to(bf), r.order, r.back)  # [N * k, 1], in sorted order
    y = torch._grouped_mm(F.silu(gate) * up * ws, down_w.to(bf).transpose(1, 2), offs=r.offs)
    return gather_routes(y, r.back, r.order).view(N, k, -1).sum(1).to(flat.dtype)


class SparseMoE(nn.Module):
    """Gate + 256 routed experts (HF names ``experts.{e}.*_proj``) + the shared expert."""

    def __init__(self, c: LLaDA2Config):
        super().__init__()
        self.gate = Gate(c)
        self.experts = nn.ModuleList(
            MLP(c.hidden_size, c.moe_intermediate_size) for _ in range(c.num_experts)
        )
        self.shared_experts = MLP(c.hidden_size, c.moe_intermediate_size * c.num_shared_experts)
        self.router_hook = None  # called with (idx, weights) of every forward
        # if set: computes the routed experts, (module, x [N, H], idx, w) -> [N, H]
        self.expert_executor = None
        self.last_load = None  # tokens per expert of the last forward (bias balancing while training)
        # while training on the padded path: rows per expert at most this x the mean
        self.capacity_factor = None
        self._stack = (None, None)  # (parameter versions, stacked weights) for inference

    def fuse_experts(self) -> None:
        """Hold the expert weights as three stacked parameters (fast training: 3 tensors, not 3 x E)."""
        if self.experts is None:
            return
        with torch.no_grad():
            w = [
                torch.stack([getattr(m, n).weight for m in self.experts])
                for n in ("gate_proj", "up_proj", "down_proj")
            ]
        self.fused = nn.ParameterList(nn.Parameter(t) for t in w)
        self.experts = None

    def unfuse_experts(self) -> None:
        """Back to one module per expert, the checkpoint's layout (``experts.{e}.*_proj.weight``)."""
        if self.experts is not None:
            return
        g, u, d = self.fused
        E, I, H = g.shape
        self.experts = nn.ModuleList(MLP(H, I) for _ in range(E)).to(device=g.device, dtype=g.dtype)
        with torch.no_grad():
            for e, m in enumerate(self.experts):
                m.gate_proj.weight.copy_(g[e]), m.up_proj.weight.copy_(u[e]), m.down_proj.weight.copy_(d[e])
        del self.fused

    def stacked_weights(self):
        """Expert weights stacked [E, I, H], [E, I, H], [E, H, I]; cached while they do not change."""
        if self.experts is None:
            return tuple(self.fused)
        ps = [p for m in self.experts for p in (m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight)]
        if torch.is_grad_enabled():
            return tuple(torch.stack(ps[i::3]) for i in range(3))
        key = (ps[0].data_ptr(), ps[0].dtype, sum(p._version for p in ps))
        if self._stack[0] != key:
            self._stack = (key, tuple(torch.stack(ps[i::3]) for i in range(3)))
        return self._stack[1]

    def forward(self, x):
        B, T, H = x.shape
        flat = x.reshape(-1, H)
        idx, w, _ = self.gate(flat)
        if self.router_hook is not None:
            self.router_hook(idx, w)
        capacity = None
        E = self.gate.weight.shape[0]
        grouped = self.training and self.expert_executor is None and grouped_gemm_available(flat)
        routes = sort_routes(idx, E) if grouped else None
        if self.training:
            self.last_load = (routes.counts if grouped else expert_counts(idx.reshape(-1), E)).detach()
            if self.capacity_factor:
                capacity = max(1, int(self.capacity_factor * idx.numel() / E))
        if self.expert_executor is not None:  # offloaded experts (validate/e2e.py)
            out = self.expert_executor(self, flat, idx, w)
        elif grouped:  # bf16 training: no padding, nothing dropped
            out = experts_grouped(flat, idx, w, *self.stacked_weights(), routes=routes)
        else:
            out = experts_padded(flat, idx, w, *self.stacked_weights(), capacity=capacity)
        return (out + self.shared_experts(flat)).view(B, T, H)


class DecoderLayer(nn.Module):
    def __init__(self, c: LLaDA2Config, i: int):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.attention = Attention(c)
        self.mlp = MLP(c.hidden_size, c.intermediate_size) if i < c.first_k_dense_replace else SparseMoE(c)
        self.i = i

    def forward(self, x, start, cache):
        x = x + self.attention(self.input_layernorm(x), start, cache, self.i)
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(nn.Module):
    def __init__(self, c: LLaDA2Config):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c, i) for i in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class LLaDA2MoeModelLM(nn.Module):
    """The LLaDA2-MoE language model (no AR shift: logits at position p predict token p)."""

    def __init__(self, c: LLaDA2Config):
        super().__init__()
        self.config = c
        self.model = Inner(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        # one decoder layer of forward_masked; torch.compile'd by compile_layers
        self._layer_fn = self._uncached

    def compile_layers(self, **options) -> None:
        """Run :meth:`forward_masked`'s decoder layers through ``torch.compile`` (``options`` go to it) while
        training: one graph for every layer of a kind, as the layers' weights are the graph's inputs. On the bf16
        grouped-GEMM path a whole MoE layer is one graph (routing, dispatch and experts have data-independent
        shapes); the padded path (no bf16) breaks the graph where it sizes its batch from the routing and
        recompiles for every new size, so it gains little. Evaluation runs eagerly."""
        self._layer_fn = torch.compile(self._uncached, dynamic=False, **options)

    def moe_layers(self):
        return [l.mlp for l in self.model.layers if isinstance(l.mlp, SparseMoE)]

    def new_cache(self, batch: int, max_len: int, block_length: int, device=None, dtype=None):
        """KV cache for block decoding: [layers, batch, kv heads, max_len, head dim] keys and values."""
        c = self.config
        p = next(self.parameters())
        shape = (c.num_hidden_layers, batch, c.num_key_value_heads, max_len, c.head_dim)
        return {
            "k": torch.zeros(shape, device=device or p.device, dtype=dtype or p.dtype),
            "v": torch.zeros(shape, device=device or p.device, dtype=dtype or p.dtype),
            "block": block_length,
        }

    def forward(self, input_ids, start: int = 0, cache: dict | None = None, block_length: int | None = None):
        """Logits of ``input_ids`` at positions start..; with ``cache`` (block decoding) the rows attend
        to the cached prefix and to each other; without, a block-causal mask over the whole input."""
        if cache is None:  # whole sequence from position 0 under the block-causal mask
            T = input_ids.shape[1]
            blk = torch.arange(T, device=input_ids.device) // (block_length or T)
            mask = blk[None, :] <= blk[:, None]
            return self.forward_masked(input_ids, torch.arange(T, device=input_ids.device), mask)
        x = self.model.word_embeddings(input_ids)
        for layer in self.model.layers:
            x = layer(x, start, cache)
        return self.lm_head(self.model.norm(x)).float()

    def forward_masked(self, input_ids, positions, attn_mask, rows: int | None = None):
        """Logits of the first ``rows`` (default all) positions of ``input_ids`` [B, T] placed at
        ``positions`` [T] under a boolean ``attn_mask`` [T, T] (True = may attend), or the same mask for
        FlexAttention (``train.objective.FlexMask``). Training uses it
        with a noisy copy and a clean copy of a sequence side by side (``models/llada2/train/objective.py``)."""
        x = self.model.word_embeddings(input_ids)
        run = self._layer_fn if self.training else self._uncached  # evaluation pads by the routing: no graph
        for layer in self.model.layers:
            x = run(layer, x, attn_mask, positions)
        x = x if rows is None else x[:, :rows]
        return self.lm_head(self.model.norm(x)).float()

    @staticmethod
    def _uncached(layer: DecoderLayer, x, mask, pos):
        h = layer.input_layernorm(x)
        a = layer.attention
        B, T, _ = h.shape
        qkv = a.query_key_value(h).view(B, T, a.nh + 2 * a.nkv, a.hd)
        q, k, v = qkv[:, :, : a.nh], qkv[:, :, a.nh : a.nh + a.nkv], qkv[:, :, a.nh + a.nkv :]
        q, k = a.query_layernorm(q), a.key_layernorm(k)
        q, k = a.rope(q.transpose(1, 2), pos), a.rope(k.transpose(1, 2), pos)
        if isinstance(mask, torch.Tensor):  # a boolean mask: scaled-dot-product attention over every pair
            rep = a.nh // a.nkv
            k, v = k.repeat_interleave(rep, 1), v.transpose(1, 2).repeat_interleave(rep, 1)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:  # a FlexMask (train/objective.py): FlexAttention, skipping the tiles with nothing to attend
            o = mask.attend(q, k, v.transpose(1, 2), block_mask=mask.block_mask, enable_gqa=True)
        x = x + a.dense(o.transpose(1, 2).reshape(B, T, a.nh * a.hd))
        return x + layer.mlp(layer.post_attention_layernorm(x))
