"""Full residency: every expert on the GPU, the no-offloading bound."""

from __future__ import annotations

from dllm_offload_sim.policies.base import LayerDecision, LayerView, Policy


class FullResidencyPolicy(Policy):
    """All experts of every layer stay on the GPU; nothing is ever missed or copied.

    Decides nothing: capacity is the layer's expert count whatever ``cache`` says (the paper's
    Cache=256 point, Fig. 17a). Used as the lower TPOT bound.
    """

    name = "full_residency"
    needs_slots = False

    def setup(self, ctx):
        super().setup(
            ctx.__class__(ctx.topology, ctx.topology.n_experts, ctx.costs, ctx.block_length, ctx.seed)
        )
        self.requested_cache = ctx.cache

    def initial_residency(self):
        return [set(range(self.ctx.n_experts)) for _ in range(self.ctx.n_layers)]

    def decide(self, view: LayerView) -> LayerDecision:
        if len(view.missed):
            return LayerDecision(
                to_gpu=view.missed.tolist(), to_cpu=[], retain=view.resident | set(view.missed.tolist())
            )
        return LayerDecision(to_gpu=[], to_cpu=[], retain=view.resident)
