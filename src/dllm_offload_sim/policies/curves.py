"""A profile's grouped-GPU-call curve as arrays, for kernels that decide by it (``clairvoyant_model``'s split).

The cost model answers ``gpu_experts_seconds(n, tokens_per_expert)`` from two curves: for ``n`` up to the profile's
largest measured call, one piecewise-linear curve in tokens per expert per ``n`` (``by_n``); beyond it, the bilinear
surface over the measured grid (``grid``). :class:`GpuCallCurves` holds both as arrays
(``CostModel.gpu_call_curves`` makes it) and :func:`gpu_call_seconds` evaluates them in a kernel with the cost
model's arithmetic, operation for operation, so that a compiled decision and a Python one agree to the bit
(``tests/test_curves.py`` holds the two equal).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dllm_offload_sim.policies.jit import kernel


@dataclass(frozen=True)
class GpuCallCurves:
    """One grouped GPU call's seconds by (experts ``n``, tokens per expert), as arrays.

    ``tokens``: the tokens-per-expert points [K] of every curve. ``by_n`` [N + 1, K] and ``by_n_tail`` [N + 1]: for
    ``n`` in 1..N, the curve's values at those points and its slope past the last (row 0 unused). ``experts`` [X]:
    the measured call sizes; ``grid`` [X, K] and ``grid_tail`` [X]: the measured curve of each, for ``n`` > N."""

    tokens: np.ndarray
    by_n: np.ndarray
    by_n_tail: np.ndarray
    experts: np.ndarray
    grid: np.ndarray
    grid_tail: np.ndarray

    def arrays(self) -> tuple:
        """The six arrays as one tuple, in field order: what kernels take (:func:`gpu_call_seconds`)."""
        return (self.tokens, self.by_n, self.by_n_tail, self.experts, self.grid, self.grid_tail)


@kernel
def curve_at(xs, ys, tail, x):  # pragma: no cover (numba)
    """``costmodel.cost_model.Curve1D``: linear between the points (``xs``, ``ys``), ``ys[0]`` below them, past the
    last point extended by ``tail`` per unit."""
    if x <= xs[0]:
        return ys[0]
    last = xs.shape[0] - 1
    if x >= xs[last]:
        return ys[last] + (x - xs[last]) * tail
    i = np.searchsorted(xs, x, side="right") - 1
    f = (x - xs[i]) / (xs[i + 1] - xs[i])
    return ys[i] + f * (ys[i + 1] - ys[i])


@kernel
def gpu_call_seconds(curves, n, per_expert):  # pragma: no cover (numba)
    """``CostModel.gpu_experts_seconds(n, per_expert)`` from :class:`GpuCallCurves`' arrays (``curves``, its
    :meth:`~GpuCallCurves.arrays`)."""
    tokens, by_n, by_n_tail, experts, grid, grid_tail = curves
    if n <= 0:
        return 0.0
    if n < by_n.shape[0]:
        return curve_at(tokens, by_n[n], by_n_tail[n], per_expert)
    x = float(n)
    X = experts.shape[0]
    if X == 1 or x <= experts[0]:
        return curve_at(tokens, grid[0], grid_tail[0], per_expert)
    if x >= experts[X - 1]:
        a = curve_at(tokens, grid[X - 2], grid_tail[X - 2], per_expert)
        b = curve_at(tokens, grid[X - 1], grid_tail[X - 1], per_expert)
        return b + (x - experts[X - 1]) * max((b - a) / (experts[X - 1] - experts[X - 2]), 0.0)
    i = np.searchsorted(experts, x, side="right") - 1
    f = (x - experts[i]) / (experts[i + 1] - experts[i])
    a = curve_at(tokens, grid[i], grid_tail[i], per_expert)
    b = curve_at(tokens, grid[i + 1], grid_tail[i + 1], per_expert)
    return a + f * (b - a)
