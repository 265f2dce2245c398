"""Load- and reuse-aware cooperative dispatch of missed experts (OLED-MoE §4.4).

Stage 1: a hardware-aware split ``rho = c / (c + T_h2d)`` (``c`` = CPU cost of an average missed
expert) bounds the number of GPU transfers, and the highest-priority missed experts fill it.
Stage 2: bounded swaps between the GPU and CPU sets (and moves of at most ``max_shift`` experts
across the split) are accepted only when they lower

    J = max(H2D path, CPU path) - lambda * sum(priority of experts sent to the GPU)

where ``lambda = reuse_weight * T_h2d * |active|`` turns a normalised priority into seconds (a
priority of 1/|active| is an average expert, worth ``reuse_weight`` of a future transfer).
Swap candidates are the ``N_CANDIDATES`` lowest-priority GPU experts and the ``N_CANDIDATES``
costliest CPU experts of the stage-1 split; equal priorities are ordered by expert id. The search is a
compiled kernel (:mod:`policies.jit`): it runs once per MoE layer, so in Python its loops were a large
part of a simulation.
"""

from __future__ import annotations

import numpy as np

from dllm_offload_sim.policies.base import CostHints
from dllm_offload_sim.policies.jit import kernel, stable_argsort

N_CANDIDATES = 4  # experts per side examined for swaps


def hardware_split(costs: CostHints, mean_tokens: float) -> float:
    """The paper's rho: fraction of missed experts to transfer given the profiled path costs."""
    return split_ratio(costs.cpu_expert_s(rounded_tokens(mean_tokens)), costs.expert_h2d_s)


@kernel
def rounded_tokens(mean_tokens):
    """The token count the split reads for ``mean_tokens`` per missed expert: the nearest integer (halves to the even
    one, as Python's ``round``), at least 1."""
    r = np.floor(mean_tokens)
    d = mean_tokens - r
    if d > 0.5 or (d == 0.5 and r % 2 == 1):
        r += 1
    return max(1, int(r))


@kernel
def split_ratio(cpu_s, h2d_s):
    """rho = c / (c + T_h2d) for a missed expert's CPU seconds ``cpu_s`` and copy seconds ``h2d_s`` (0.5 at 0 cost)."""
    return cpu_s / (cpu_s + h2d_s) if cpu_s + h2d_s > 0 else 0.5


def cooperative_dispatch(
    missed: list,
    tokens: list,
    priority: list,
    costs: CostHints,
    rho: float,
    n_active: int,
    token_rows: int,
    reuse_weight: float = 0.5,
    max_swaps: int = 4,
    max_shift: int = 1,
):
    """Split ``missed`` experts (with aligned ``tokens`` and ``priority`` lists) into (to_gpu, to_cpu).
    ``token_rows``: the layer's token rows, whose activations go to the CPU and back (the dispatch cost the
    simulator charges a layer that runs CPU experts)."""
    if not missed:
        return [], []
    in_gpu = split_misses(
        np.asarray(priority, np.float64),
        np.asarray(costs.cpu_costs(tokens), np.float64),
        costs.cpu_dispatch_s(token_rows),
        costs.expert_h2d_s,
        costs.cpu_workers,
        rho,
        n_active,
        reuse_weight,
        max_swaps,
        max_shift,
    )
    flags = in_gpu.tolist()
    return [e for e, g in zip(missed, flags) if g], [e for e, g in zip(missed, flags) if not g]


@kernel
def split_misses(
    priority, cpu_cost, cpu_fixed, h2d, workers, rho, n_active, reuse_weight, max_swaps, max_shift
):
    """The two stages for missed experts with ``priority`` and CPU seconds ``cpu_cost`` (aligned arrays;
    ``cpu_fixed``: the layer's CPU dispatch cost); returns a bool mask, True = copy to the GPU."""
    m = priority.shape[0]
    in_gpu = np.zeros(m, np.bool_)
    if m == 0:
        return in_gpu
    order = stable_argsort(-priority)  # stable: equal priorities keep id order
    n_gpu = int(round(rho * m))
    for i in range(n_gpu):
        in_gpu[order[i]] = True
    if max_swaps <= 0 or m == 1:
        return in_gpu
    workers = max(1, workers)
    lam = reuse_weight * h2d * max(n_active, 1)
    n_g = n_gpu
    cpu_sum = 0.0
    for i in range(n_gpu, m):
        cpu_sum += cpu_cost[order[i]]
    prio_sum = 0.0
    for i in range(n_gpu):
        prio_sum += priority[order[i]]
    g_pool = order[max(n_gpu - N_CANDIDATES, 0) : n_gpu][::-1]  # lowest-priority GPU experts, lowest first
    rest = order[n_gpu:]
    c_pool = rest[stable_argsort(-cpu_cost[rest])[:N_CANDIDATES]]  # costliest CPU experts, stable
    lo, hi = n_gpu - max_shift, n_gpu + max_shift
    for _ in range(max_swaps):
        # J = max(H2D path, CPU path) - lam * prio_sum. Stage 1 sent the highest priorities to the GPU,
        # so a change can only pay off by shortening whichever path is the longer one.
        h_path = n_g * h2d
        c_path = cpu_fixed + cpu_sum / workers if n_g < m else 0.0
        cur = max(h_path, c_path) - lam * prio_sum - 1e-12
        best_v, best_g, best_c = cur, -1, -1
        if c_path > h_path:  # CPU-bound: swap a cheap GPU expert for a costly CPU one, or move one to the GPU
            for c in c_pool:
                if in_gpu[c]:
                    continue
                pc, ccc = priority[c], cpu_cost[c]
                for g in g_pool:
                    if not in_gpu[g]:
                        continue
                    cp = cpu_fixed + (cpu_sum - ccc + cpu_cost[g]) / workers
                    v = max(h_path, cp) - lam * (prio_sum - priority[g] + pc)
                    if v < best_v:
                        best_v, best_g, best_c = v, g, c
                if n_g < hi:
                    hp = h_path + h2d
                    cp = cpu_fixed + (cpu_sum - ccc) / workers if n_g + 1 < m else 0.0
                    v = max(hp, cp) - lam * (prio_sum + pc)
                    if v < best_v:
                        best_v, best_g, best_c = v, -1, c
        elif n_g > lo:  # H2D-bound: move a low-priority GPU expert to the CPU
            hp = h_path - h2d
            for g in g_pool:
                if not in_gpu[g]:
                    continue
                cp = cpu_fixed + (cpu_sum + cpu_cost[g]) / workers
                v = max(hp, cp) - lam * (prio_sum - priority[g])
                if v < best_v:
                    best_v, best_g, best_c = v, g, -1
        if best_g < 0 and best_c < 0:
            break
        if best_g >= 0:
            in_gpu[best_g] = False
            n_g -= 1
            cpu_sum += cpu_cost[best_g]
            prio_sum -= priority[best_g]
        if best_c >= 0:
            in_gpu[best_c] = True
            n_g += 1
            cpu_sum -= cpu_cost[best_c]
            prio_sum += priority[best_c]
    return in_gpu
