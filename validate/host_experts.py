"""HostExperts: every routed expert's weights in (pinned) host memory, at a model's real shape."""

from __future__ import annotations

import torch

from traces.topology import ModelTopology


class HostExperts:
    """Holds the experts the GPU copies from and the CPU computes with.

    ``w13[r, e]`` ``[2*I, H]`` and ``w2[r, e]`` ``[H, I]`` for ``r`` in ``n_real_layers``; MoE layer
    ``l`` reads real layer ``l % n_real_layers``. With fewer real layers than MoE layers the experts
    alias (LLaDA2.0-flash's ~200 GB of experts do not fit in host memory; copy and compute time do
    not depend on the values). Weights are random (seeded): this is for timing, not for outputs.
    """

    def __init__(self, topo: ModelTopology, n_real_layers: int | None = None, dtype=torch.bfloat16,
                 pin: bool = True, seed: int = 0):
        self.topo = topo
        self.n_real = n_real_layers or topo.n_moe_layers
        E, H, I = topo.n_experts, topo.hidden, topo.moe_intermediate
        g = torch.Generator().manual_seed(seed)
        pin = pin and torch.cuda.is_available()
        self.w13 = torch.empty((self.n_real, E, 2 * I, H), dtype=dtype, pin_memory=pin)
        self.w2 = torch.empty((self.n_real, E, H, I), dtype=dtype, pin_memory=pin)
        scale = H ** -0.5
        for r in range(self.n_real):  # layer by layer to bound the fp32 temporary
            self.w13[r] = (torch.randn((E, 2 * I, H), generator=g) * scale).to(dtype)
            self.w2[r] = (torch.randn((E, H, I), generator=g) * I ** -0.5).to(dtype)
        self.pinned = pin

    def expert(self, layer: int, e: int) -> tuple[torch.Tensor, torch.Tensor]:
        r = layer % self.n_real
        return self.w13[r, e], self.w2[r, e]

    @property
    def expert_bytes(self) -> int:
        return (self.w13[0, 0].numel() + self.w2[0, 0].numel()) * self.w13.element_size()
