"""The non-expert part of an LLaDA2 layer at real shapes (random weights): attention with a
block-causal KV cache, RMSNorms, the router and the shared expert; plus the dense MLP of layer 0 and
the lm-head with sampling. Used to time what the simulator calls ``non_expert``, ``dense_layer`` and
``per_forward`` (the math is the HF ``modeling_llada2_moe.py``'s, as in ``models/llada2/modeling.py``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dllm_offload_sim.traces.topology import ModelTopology


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope_tables(pos: torch.Tensor, rot: int, dtype, theta: float = 600000.0):
    """cos and sin ``[T, rot]`` for positions ``pos`` (partial RoPE over ``rot`` dims)."""
    inv = theta ** (-torch.arange(0, rot, 2, device=pos.device, dtype=torch.float32) / rot)
    f = pos.float()[:, None] * inv[None]
    f = torch.cat([f, f], -1)
    return f.cos().to(dtype), f.sin().to(dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Partial rotary embedding on the first ``cos.shape[-1]`` dims of ``x [heads, T, hd]``."""
    rot = cos.shape[-1]
    xr, xp = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated = torch.cat([-xr[..., half:], xr[..., :half]], -1)
    return torch.cat([xr * cos + rotated * sin, xp], -1)


def group_limited_topk_torch(scores: torch.Tensor, n_group: int, topk_group: int, k: int) -> torch.Tensor:
    T, E = scores.shape
    g = scores.view(T, n_group, E // n_group)
    gs = g.topk(2, dim=-1).values.sum(-1)
    keep = gs.topk(topk_group, dim=-1).indices
    mask = torch.zeros_like(gs, dtype=torch.bool).scatter_(1, keep, True)
    masked = scores.masked_fill(~mask.repeat_interleave(E // n_group, dim=1), float("-inf"))
    return masked.topk(k, dim=-1).indices


class NonExpertLayer:
    """Attention + norms + router + shared expert of one MoE layer (or the dense MLP of layer 0)."""

    def __init__(
        self, topo: ModelTopology, device="cpu", dtype=torch.bfloat16, dense: bool = False, seed: int = 0
    ):
        g = torch.Generator().manual_seed(seed)
        H, nh, nkv, hd = topo.hidden, topo.n_heads, topo.n_kv_heads, topo.head_dim

        def w(*shape, scale=None):
            t = torch.randn(shape, generator=g) * (scale if scale is not None else shape[-1] ** -0.5)
            return t.to(device=device, dtype=dtype)

        self.topo, self.dense, self.device, self.dtype = topo, dense, device, dtype
        self.ln1, self.ln2 = (
            torch.ones(H, device=device, dtype=dtype),
            torch.ones(H, device=device, dtype=dtype),
        )
        self.qkv, self.o = w((nh + 2 * nkv) * hd, H), w(H, nh * hd)
        self.qn, self.kn = (
            torch.ones(hd, device=device, dtype=dtype),
            torch.ones(hd, device=device, dtype=dtype),
        )
        inter = topo.dense_intermediate if dense else topo.moe_intermediate * topo.n_shared_experts
        # the shared experts' MLP (or the dense one); a model without shared experts has none
        self.w13, self.w2 = (w(2 * inter, H), w(H, inter)) if inter else (None, None)
        self.gate = (torch.randn((topo.n_experts, H), generator=g) * H**-0.5).to(
            device=device, dtype=torch.float32
        )
        self.bias = torch.zeros(topo.n_experts, device=device, dtype=torch.float32)

    def new_cache(self, max_len: int):
        t = self.topo
        shape = (t.n_kv_heads, max_len, t.head_dim)
        return torch.zeros(shape, device=self.device, dtype=self.dtype), torch.zeros(
            shape, device=self.device, dtype=self.dtype
        )

    def __call__(self, x: torch.Tensor, cache, start: int):
        """x ``[T, H]`` at positions ``start..start+T-1``; returns (hidden after attention, routing ids,
        routing weights, shared-expert or dense-MLP output, None for a model without shared experts)."""
        t = self.topo
        T = x.shape[0]
        nh, nkv, hd = t.n_heads, t.n_kv_heads, t.head_dim
        h = rms_norm(x, self.ln1)
        qkv = (h @ self.qkv.t()).view(T, nh + 2 * nkv, hd).transpose(0, 1)
        q, k, v = qkv[:nh], qkv[nh : nh + nkv], qkv[nh + nkv :]
        q, k = rms_norm(q, self.qn), rms_norm(k, self.kn)
        cos, sin = rope_tables(torch.arange(start, start + T, device=x.device), hd // 2, x.dtype)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        kc, vc = cache
        kc[:, start : start + T], vc[:, start : start + T] = k, v
        # block-causal: the block sees the cached prefix and itself (GQA: query groups share KV heads)
        qg = q.reshape(nkv, nh // nkv * T, hd)
        a = F.scaled_dot_product_attention(qg, kc[:, : start + T], vc[:, : start + T]).view(nh, T, hd)
        x = x + a.transpose(0, 1).reshape(T, nh * hd) @ self.o.t()
        h2 = rms_norm(x, self.ln2)
        mlp = None
        if self.w13 is not None:
            i = self.w2.shape[1]
            hh = h2 @ self.w13.t()
            mlp = (F.silu(hh[:, :i]) * hh[:, i:]) @ self.w2.t()
        if self.dense:
            return x, None, None, mlp
        s = torch.sigmoid(h2.float() @ self.gate.t())
        ids = group_limited_topk_torch(s + self.bias, t.n_group, t.topk_group, t.top_k)
        wts = s.gather(1, ids)
        wts = wts / (wts.sum(-1, keepdim=True) + 1e-20) * 2.5
        return x, ids, wts, mlp


class LmHead:
    """Final norm, lm-head and greedy sampling with confidence (max softmax probability)."""

    def __init__(self, topo: ModelTopology, device="cpu", dtype=torch.bfloat16, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.norm = torch.ones(topo.hidden, device=device, dtype=dtype)
        self.w = (torch.randn((topo.vocab_size, topo.hidden), generator=g) * topo.hidden**-0.5).to(
            device=device, dtype=dtype
        )

    def __call__(self, x: torch.Tensor):
        logits = (rms_norm(x, self.norm) @ self.w.t()).float()
        p = torch.softmax(logits, -1)
        conf, tok = p.max(-1)
        return tok, conf
