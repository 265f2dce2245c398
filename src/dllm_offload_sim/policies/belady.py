"""Clairvoyant retention: Belady's rule with bypass, per MoE layer; handed the future explicitly."""

from __future__ import annotations

import numpy as np

from dllm_offload_sim.policies.base import ClairvoyantPolicy, LayerDecision, LayerView, PolicyError
from dllm_offload_sim.policies.dispatch import cooperative_dispatch, hardware_split
from dllm_offload_sim.policies.curves import gpu_call_seconds
from dllm_offload_sim.policies.jit import kernel, stable_argsort
from dllm_offload_sim.policies.select import keep_top_by, resident_and, top_of

NEVER = np.iinfo(np.int32).max  # a next use that never comes (schedule.batch.ActivationOracle.NEVER)


@kernel
def belady_retain(to_gpu, resident_row, capacity, next_row):  # pragma: no cover (numba)
    """Belady retention at one MoE layer: of its residents (``resident_row``, a mask by expert) and its copied
    ``to_gpu`` experts, the ``capacity`` whose next activation (``next_row``, by expert; ``NEVER`` for none) comes
    soonest, ties to the lower id, experts never used again dropped (in no particular order)."""
    cands = resident_and(resident_row, to_gpu)
    cands = cands[next_row[cands] != NEVER]
    key = -(next_row[cands].astype(np.float64))
    return top_of(cands, capacity, key, key)


@kernel
def model_split(
    missed,
    missed_tokens,
    next_row,
    resident_row,
    capacity,
    hits,
    hit_pairs,
    cpu_s,
    dispatch_s,
    h2d,
    workers,
    curves,
):  # pragma: no cover (numba)
    """``clairvoyant_model``'s split of a layer's misses (``BeladyPolicy``'s docstring): which of ``missed`` (with
    ``missed_tokens`` routed pairs each) are copied, as a mask. The misses ordered by next use (``next_row``, by
    expert), soonest first, then more tokens, then as given; the first ``m`` copied, ``m`` minimising
    ``max(GPU call(hits + m) + m h2d, dispatch + CPU experts / workers) - h2d min(capacity, kept)``, where ``kept``
    counts the residents (``resident_row``) and the first ``m`` misses with a next use; ties to the fewest copied.
    ``cpu_s``: one CPU expert's seconds by token count; the GPU call from ``curves``
    (``policies.curves.GpuCallCurves.arrays``)."""
    M = missed.shape[0]
    key = np.empty(M, np.int64)
    for i in range(M):  # next use, then more tokens first (token counts are below 2**32)
        key[i] = next_row[missed[i]] * 4294967296 - missed_tokens[i]
    order = stable_argsort(key)
    cpu_rest = np.zeros(M + 1)  # the CPU experts' seconds when the first m are copied, summed from the last
    for i in range(M - 1, -1, -1):
        cpu_rest[i] = cpu_rest[i + 1] + cpu_s[missed_tokens[order[i]]]
    kept = 0
    for e in range(resident_row.shape[0]):
        if resident_row[e] and next_row[e] != NEVER:
            kept += 1
    best, best_m, pairs = np.inf, M, 0
    for m in range(M + 1):
        n = hits + m
        gpu = (gpu_call_seconds(curves, n, (hit_pairs + pairs) / n) if n else 0.0) + m * h2d
        cpu_path = dispatch_s + cpu_rest[m] / workers if m < M else 0.0
        j = max(gpu, cpu_path) - h2d * min(capacity, kept)
        if j < best - 1e-15:
            best, best_m = j, m
        if m < M:
            pairs += missed_tokens[order[m]]
            if next_row[missed[order[m]]] != NEVER:
                kept += 1
    to_gpu = np.zeros(M, np.bool_)
    for i in range(best_m):
        to_gpu[order[i]] = True
    return to_gpu


class BeladyPolicy(ClairvoyantPolicy):
    """Per-layer Belady retention with bypass: after each MoE layer keep the ``capacity`` experts (among
    residents and copied ones) whose next activation at this layer comes soonest; experts never used again
    are dropped.

    ``dispatch: gpu`` (``belady``): every miss is copied, so its misses and copies are the fewest any
    non-prefetching policy can have at the same per-layer capacity: a bound on hit rate and copies (and on
    the TPOT of policies that run every expert on the GPU).
    ``dispatch: coop`` (``clairvoyant_coop``): misses split like OLED-MoE's, with the clairvoyant reuse value
    ``1 / (forwards until next use)``, normalised over the layer's active experts as OLED's priorities are, as
    the priority. A strong clairvoyant heuristic for systems with CPU compensation, **not** a bound: the split
    is a heuristic, so a deployable policy can beat it. Not deployable: it reads a :class:`FutureOracle`.
    ``dispatch: model`` (``clairvoyant_model``): the schedule the TPOT bound's model suggests (sim/bound.py). Misses
    ordered by next use (soonest first, then more tokens), the first ``m`` copied and the rest run on the CPU, with
    ``m`` minimising the layer's expert time in that model, the copies now on the GPU path,
    ``max(GPU call(hits + m) + m T_h2d, CPU dispatch + CPU experts / workers)``, less a copy's time for every expert
    with a next use that Belady retention then keeps (each saves a later copy). Feasible, so the bound is below it;
    the gap between the two is what neither knows.
    """

    def __init__(
        self, dispatch: str = "gpu", reuse_weight: float = 0.5, max_swaps: int = 4, max_shift: int = 1
    ):
        if dispatch not in ("gpu", "coop", "model"):
            raise PolicyError(f"belady: dispatch must be 'gpu', 'coop' or 'model', got {dispatch!r}")
        self.dispatch = dispatch
        self.name = {"gpu": "belady", "coop": "clairvoyant_coop", "model": "clairvoyant_model"}[dispatch]
        self.reuse_weight, self.max_swaps, self.max_shift = reuse_weight, max_swaps, max_shift

    def decide(self, view: LayerView) -> LayerDecision:
        j, f = view.layer, view.forward.index
        next_use = self.oracle.next_uses(j, f).astype(np.int64)
        nx = next_use.astype(np.float64)
        never = nx >= np.iinfo(np.int32).max
        missed = view.missed
        if self.dispatch == "coop" and len(missed):
            mt = view.missed_tokens.tolist()
            reuse = np.where(never, 0.0, 1.0 / np.maximum(nx - f, 1.0))
            total = float(reuse[view.active].sum()) or 1.0
            prio = (reuse[missed] / total).tolist()
            rho = hardware_split(self.ctx.costs, sum(mt) / len(mt))
            to_gpu, to_cpu = cooperative_dispatch(
                missed.tolist(),
                mt,
                prio,
                self.ctx.costs,
                rho,
                len(view.active),
                view.ids.shape[0],
                self.reuse_weight,
                self.max_swaps,
                self.max_shift,
            )
        elif self.dispatch == "model" and len(missed):
            to_gpu, to_cpu = self._model_split(view, next_use)
        else:
            to_gpu, to_cpu = missed.tolist(), []
        row = view.resident_row(self.ctx.n_experts)
        retain = belady_retain(np.asarray(to_gpu, np.int64), row, view.capacity, next_use)
        return LayerDecision(to_gpu=to_gpu, to_cpu=to_cpu, retain=set(retain.tolist()))

    def model_costs(self, rows: int, most_tokens: int) -> tuple:
        """What :func:`model_split` reads of the costs in a forward of ``rows`` token rows whose experts get at most
        ``most_tokens`` tokens: (CPU seconds by token count, the CPU dispatch, one copy, the CPU workers, the GPU call's
        curves)."""
        costs = self.ctx.costs
        if costs.gpu_curves is None:
            raise PolicyError(
                "clairvoyant_model: its costs carry no GPU call curves (CostHints.from_cost_model makes them)"
            )
        cpu_s, dispatch_s = costs.cost_arrays(max(rows, most_tokens))
        return (
            cpu_s,
            dispatch_s[rows],
            costs.expert_h2d_s,
            max(1, costs.cpu_workers),
            costs.gpu_curves.arrays(),
        )

    def _model_split(self, view: LayerView, next_use: np.ndarray) -> tuple[list, list]:
        """``dispatch: model``'s split of the layer's misses (class docstring; :func:`model_split`)."""
        missed, mtok = view.missed, view.missed_tokens
        to_gpu = model_split(
            missed,
            mtok.astype(np.int64),
            next_use,
            view.resident_row(self.ctx.n_experts),
            view.capacity,
            len(view.active) - len(missed),
            int(view.tokens.sum()) - int(mtok.sum()),
            *self.model_costs(view.ids.shape[0], int(mtok.max())),
        )
        return sorted(missed[to_gpu].tolist()), sorted(missed[~to_gpu].tolist())

    def trim(self, layer, resident, capacity):
        nx = self.oracle.next_uses(layer, self._forward).astype(np.float64)
        cands = np.asarray(sorted(resident), np.int64)
        return keep_top_by(cands, capacity, -nx[cands])

    def begin_forward(self, fwd):
        self._forward = fwd.index - 1
