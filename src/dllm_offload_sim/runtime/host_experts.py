"""HostExperts: every routed expert's weights in (pinned) host memory, at a model's real shape."""

from __future__ import annotations

import torch

from dllm_offload_sim.traces.topology import ModelTopology


def expert_views(flat: torch.Tensor, hidden: int, inter: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``w13 [..., 2*I, H]`` and ``w2 [..., H, I]`` as views of ``flat [..., 3*I*H]``: one expert's weights in one
    contiguous run (gate and up, then down), so that copying an expert is one operation."""
    lead, n13 = flat.shape[:-1], 2 * inter * hidden
    return flat[..., :n13].view(*lead, 2 * inter, hidden), flat[..., n13:].view(*lead, hidden, inter)


class HostExperts:
    """Holds the experts the GPU copies from and the CPU computes with.

    ``flat[r, e]`` ``[3*I*H]`` is one expert's weights in one contiguous run, seen as ``w13[r, e]``
    ``[2*I, H]`` and ``w2[r, e]`` ``[H, I]`` (``expert_views``), for ``r`` in ``n_real_layers``; MoE layer
    ``l`` reads real layer ``l % n_real_layers``. With fewer real layers than MoE layers the experts
    alias (LLaDA2.0-flash's ~200 GB of experts do not fit in host memory; copy and compute time do
    not depend on the values). Weights are random (seeded): this is for timing, not for outputs.
    """

    def __init__(
        self,
        topo: ModelTopology,
        n_real_layers: int | None = None,
        dtype=torch.bfloat16,
        pin: bool = True,
        seed: int = 0,
    ):
        self.topo = topo
        self.n_real = n_real_layers or topo.n_moe_layers
        E, H, I = topo.n_experts, topo.hidden, topo.moe_intermediate
        g = torch.Generator().manual_seed(seed)
        pin = pin and torch.cuda.is_available()
        self.flat = torch.empty((self.n_real, E, 3 * I * H), dtype=dtype, pin_memory=pin)
        self.w13, self.w2 = expert_views(self.flat, H, I)
        scale = H**-0.5
        for r in range(self.n_real):  # layer by layer to bound the fp32 temporary
            self.w13[r] = (torch.randn((E, 2 * I, H), generator=g) * scale).to(dtype)
            self.w2[r] = (torch.randn((E, H, I), generator=g) * I**-0.5).to(dtype)
        self.pinned = pin
        self._rows: dict = {}  # real layer -> its experts' contiguous runs as views (expert_flat)

    @classmethod
    def from_model(cls, model, dtype=None, pin: bool = True) -> "HostExperts":
        """The routed experts of a LLaDA2 model (``models.llada2``), layer by layer, in host memory:
        ``w13 = [gate_proj; up_proj]``, ``w2 = down_proj`` (the end-to-end mode computes with them)."""
        moes = model.moe_layers()
        g0 = moes[0].stacked_weights()[0]
        self = cls.__new__(cls)
        self.topo = model.config.topology()
        self.n_real = len(moes)
        E, I, H = g0.shape
        dtype = dtype or g0.dtype
        pin = pin and torch.cuda.is_available()
        self.flat = torch.empty((self.n_real, E, 3 * I * H), dtype=dtype, pin_memory=pin)
        self.w13, self.w2 = expert_views(self.flat, H, I)
        with torch.no_grad():
            for r, moe in enumerate(moes):
                g, u, d = moe.stacked_weights()
                self.w13[r, :, :I] = g.to("cpu", dtype)
                self.w13[r, :, I:] = u.to("cpu", dtype)
                self.w2[r] = d.to("cpu", dtype)
        self.pinned = pin
        self._rows = {}
        return self

    def expert(self, layer: int, e: int) -> tuple[torch.Tensor, torch.Tensor]:
        r = layer % self.n_real
        return self.w13[r, e], self.w2[r, e]

    def expert_flat(self, layer: int, e: int) -> torch.Tensor:
        """Expert ``e`` of MoE layer ``layer`` as one contiguous run (what one copy moves). The views of a real layer
        are made once, on its first use: a layer's demand copies then cost no view-making on the host."""
        r = layer % self.n_real
        rows = self._rows.get(r)
        if rows is None:
            rows = self._rows[r] = self.flat[r].unbind(0)
        return rows[e]

    @property
    def expert_bytes(self) -> int:
        return self.flat[0, 0].numel() * self.flat.element_size()
