"""KTransformers (Chen et al., SOSP'25): hot experts pinned on the GPU, the rest computed on the CPU."""

from __future__ import annotations

import numpy as np

from dllm_offload_sim.policies.base import LayerDecision, LayerView, OfflineKnowledge, Policy, PolicyError
from dllm_offload_sim.policies.select import keep_top


class KTransformersPolicy(Policy):
    """Static GPU experts plus CPU execution of every other activated expert; no weight transfers.

    Decides: ``Cache`` experts per layer stay on the GPU (``placement: uniform`` = the first ids of
    each layer, KT's default; ``frequency`` = the global top ``Cache x L`` (layer, expert) pairs of the
    offline activation counts of the trace's other requests). Every missed expert runs on the CPU,
    concurrently with the GPU's resident experts. For a forward of at least
    ``gpu_prefill_token_threshold`` tokens (layerwise GPU prefill) the whole layer is streamed: all
    misses are copied and run on the GPU, and with ``dynamic_update`` the layer's GPU set becomes
    that forward's ``Cache`` most-routed experts. Expert Deferral (which changes model outputs) is
    not modelled. Source: kvcache-ai/ktransformers kt-kernel, sglang kt_ep_wrapper (baselines.md §3).
    """

    name = "ktransformers"
    needs_slots = False

    def __init__(
        self,
        placement: str = "frequency",
        gpu_prefill_token_threshold: int = 4096,
        dynamic_update: bool = False,
    ):
        if placement not in ("uniform", "frequency"):
            raise PolicyError(f"ktransformers: placement must be 'uniform' or 'frequency', got {placement!r}")
        self.placement_kind = placement
        self.threshold = int(gpu_prefill_token_threshold)
        self.dynamic_update = dynamic_update

    def setup(self, ctx):
        super().setup(ctx)
        self.placement = [set(range(ctx.cache)) for _ in range(ctx.n_layers)]

    def initial_residency(self):
        return [set(s) for s in self.placement]

    def begin_batch(self, knowledge: OfflineKnowledge):
        pop = knowledge.popularity
        if self.placement_kind == "uniform" or pop is None:
            return None
        E = self.ctx.n_experts
        flat = np.asarray(pop, float).ravel()
        order = np.lexsort((np.arange(flat.size), -flat))[: self.ctx.total_slots]
        self.placement = [set() for _ in range(self.ctx.n_layers)]
        for i in order:
            self.placement[i // E].add(int(i % E))
        self._caps = np.array([len(s) for s in self.placement], np.int64)
        return [set(s) for s in self.placement]

    def streams(self, n_tokens: int) -> bool:
        """Whether a forward of ``n_tokens`` streams its layers (layerwise GPU prefill: every miss copied, none run on
        the CPU)."""
        return n_tokens >= self.threshold

    def decide(self, view: LayerView) -> LayerDecision:
        missed = view.missed.tolist()
        if self.streams(view.forward.n_tokens):
            retain = view.resident
            if self.dynamic_update:
                tok = dict(zip(view.active.tolist(), view.tokens.tolist()))
                retain = keep_top(view.resident | set(missed), lambda e: tok.get(e, 0), view.capacity)
            return LayerDecision(to_gpu=missed, to_cpu=[], retain=retain)
        return LayerDecision(to_gpu=[], to_cpu=missed, retain=view.resident)
