"""The CPU expert curve fitted from timed calls: what the profiler measures turned into ``cpu_expert``'s per-expert
seconds, fixed cost per call and bands. Pure arithmetic (no torch), shared by the profiler and by
``dllm-profile --refit``, which fits a stored profile's calls again without a GPU."""

from __future__ import annotations

import numpy as np

from dllm_offload_sim.costmodel.cost_model import Curve1D

CPU_OVERHEAD_MAX_TOKENS = 16


def cpu_expert_fit(
    tokens: list, one: list, many: list, many_n: list, dispatch: list | None = None
) -> tuple[list, float]:
    """(seconds per expert at each of ``tokens``, the fixed cost of a call) from a 1-expert call (``one``) and an
    ``many_n``-expert call (``many``) at each point, and ``dispatch`` (the activations' round trip for that many rows,
    at ``tokens`` rows; None: 0). The fixed cost is the median over the decode-sized points (at most
    ``CPU_OVERHEAD_MAX_TOKENS`` tokens) of the 1-expert call beyond its expert and its round trip. At those points an
    expert costs the slope from the 1- to the many-expert call. Past them a 1-expert call leaves a parallel engine's
    threads idle, so the slope can fall to nothing (kt-kernel on the H200 and H100 hosts at 32-128 tokens); there an
    expert costs at least the many-expert call's own average beyond the fixed cost and the round trip of its rows
    (the curve read at ``many_n x tokens`` rows as the cost model reads it, :class:`~dllm_offload_sim.costmodel.cost_model.Curve1D`)."""
    trip = list(dispatch) if dispatch else [0.0] * len(one)
    slope = [max((b - a) / (m - 1), 0.0) for a, b, m in zip(one, many, many_n)]
    small = [i for i, n in enumerate(tokens) if n <= CPU_OVERHEAD_MAX_TOKENS] or [0]
    overhead = float(np.median([max(one[i] - slope[i] - trip[i], 0.0) for i in small]))
    round_trip = Curve1D(tokens, trip)  # as the cost model reads the dispatch curve
    return [
        slope[i]
        if n <= CPU_OVERHEAD_MAX_TOKENS
        else max(slope[i], (b - overhead - round_trip(m * n)) / m, 0.0)
        for i, (n, b, m) in enumerate(zip(tokens, many, many_n))
    ], overhead


def cpu_band_fit(after: list, band_n: list, band_s: list, many_n: list, many: list, per_expert: list) -> list:
    """``cpu_expert.bands`` from the timed calls: band ``b`` applies to the experts beyond ``after[b]`` and costs, at
    each point, the slope from the previous call's time (the ``many_n``-expert call's, then band ``b - 1``'s) to its
    own ``band_s[b][i]`` over ``band_n[b][i]`` experts; where the call is no larger than the previous one (not
    timed), the previous band's cost (the first band: ``per_expert``)."""
    bands, prev_n, prev_t, prev_cost = [], list(many_n), list(many), list(per_expert)
    for b in range(len(band_n)):
        cost = []
        for i in range(len(many_n)):
            n, t = band_n[b][i], band_s[b][i]
            if n > prev_n[i]:
                cost.append(max((t - prev_t[i]) / (n - prev_n[i]), 0.0))
                prev_n[i], prev_t[i] = n, t
            else:
                cost.append(prev_cost[i])
        bands.append({"after": after[b], "seconds": cost})
        prev_cost = cost
    return bands
