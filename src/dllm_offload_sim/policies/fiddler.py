"""Fiddler (Kamahori et al., ICLR'25): static popular experts on the GPU, per-miss CPU-or-copy."""

from __future__ import annotations

import numpy as np

from dllm_offload_sim.policies.base import LayerDecision, LayerView, OfflineKnowledge, Policy, PolicyError


class FiddlerPolicy(Policy):
    """Static placement by offline popularity; no runtime cache.

    Decides: the ``Cache x L`` most popular (layer, expert) pairs of the offline profile (routed-token
    counts of the trace's *other* requests; the first ids per layer when there are none) stay on the
    GPU for the whole run. A missed expert with ``n`` tokens runs on the CPU when
    ``cpu(n) < h2d + gpu(1, n)`` (the code's per-expert argmin of the summed cost, default
    ``objective: sum``); otherwise its weights are copied into a scratch buffer, it runs on the GPU,
    and it is *not* kept. ``objective: max`` instead balances the two devices: experts are taken in
    decreasing token order and each goes to the side whose running total stays smaller (the goal the
    code's comment states). Source: efeslab/fiddler ``mixtral_forward`` (baselines.md §4).
    """

    name = "fiddler"
    needs_slots = False

    def __init__(self, objective: str = "sum"):
        if objective not in ("sum", "max"):
            raise PolicyError(f"fiddler: objective must be 'sum' or 'max', got {objective!r}")
        self.objective = objective

    def setup(self, ctx):
        super().setup(ctx)
        self.placement = self._place(None)
        self._on_cpu: dict[int, bool] = {}

    def _place(self, popularity):
        L, E, C = self.ctx.n_layers, self.ctx.n_experts, self.ctx.cache
        if popularity is None:
            return [set(range(C)) for _ in range(L)]
        flat = np.asarray(popularity, float).ravel()
        order = np.lexsort((np.arange(flat.size), -flat))[: self.ctx.total_slots]
        placement = [set() for _ in range(L)]
        for i in order:
            placement[i // E].add(int(i % E))
        return placement

    def initial_residency(self):
        return [set(s) for s in self.placement]

    def begin_batch(self, knowledge: OfflineKnowledge):
        self.placement = self._place(knowledge.popularity)
        self._caps = np.array([len(s) for s in self.placement], np.int64)
        return [set(s) for s in self.placement]

    def cpu_wins(self, n: int) -> bool:
        """``objective: sum``'s choice for a missed expert of ``n`` routed tokens: the CPU where
        ``cpu(n) < h2d + gpu(1, n)`` on the cost hints (fixed for a run, so each count is computed once)."""
        wins = self._on_cpu.get(n)
        if wins is None:
            c = self.ctx.costs
            wins = self._on_cpu[n] = c.cpu_expert_s(n) < c.expert_h2d_s + c.gpu_experts_s(1, n)
        return wins

    def decide(self, view: LayerView) -> LayerDecision:
        c = self.ctx.costs
        tokens = dict(zip(view.active.tolist(), view.tokens.tolist()))
        to_gpu, to_cpu = [], []
        if self.objective == "sum":
            for e in view.missed.tolist():
                (to_cpu if self.cpu_wins(int(tokens[e])) else to_gpu).append(e)
        else:
            g_tot = c_tot = 0.0
            for e in sorted(view.missed.tolist(), key=lambda e: (-tokens[e], e)):
                n = int(tokens[e])
                g, k = c.expert_h2d_s + c.gpu_experts_s(1, n), c.cpu_expert_s(n)
                if c_tot + k <= g_tot + g:
                    to_cpu.append(e)
                    c_tot += k
                else:
                    to_gpu.append(e)
                    g_tot += g
        return LayerDecision(to_gpu=to_gpu, to_cpu=to_cpu, retain=view.resident)

    def trim(self, layer, resident, capacity):
        return set(sorted(resident)[:capacity])
