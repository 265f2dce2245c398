"""Dot products of this forward's expert map with stored maps, for the trajectory-matching policies.

A stored collection is held expert-major per layer (``[E, N]``: one row of N maps per expert), so that a
map with few experts (one forward's routing) reads only its experts' rows. The sums run over the experts
in id order, the same on every machine.
"""

from __future__ import annotations

import numpy as np

from dllm_offload_sim.policies.jit import kernel


@kernel
def sparse_dots(store_em, vec, n, out, accumulate):  # pragma: no cover (numba)
    """``out[:n] (+)= store_em[:, :n].T @ vec`` over the experts where ``vec`` is not 0 (``store_em`` [E, N],
    ``vec`` [E]): each stored map's dot product with ``vec``, added to ``out`` if ``accumulate``."""
    if not accumulate:
        out[:n] = 0.0
    for e in range(vec.shape[0]):
        v = vec[e]
        if v != 0.0:
            for i in range(n):
                out[i] += v * store_em[e, i]


def dots(
    store_em: np.ndarray, vec: np.ndarray, n: int, out: np.ndarray | None = None, accumulate: bool = False
) -> np.ndarray:
    """The dot products of ``vec`` with the first ``n`` maps of the expert-major ``store_em``; into ``out``."""
    if out is None:
        out = np.zeros(n)
    sparse_dots(store_em, np.ascontiguousarray(vec, dtype=np.float64), n, out, accumulate)
    return out
