"""Compiled numeric kernels for hot paths (numba, ``nopython`` mode): policies' per-layer arithmetic and the
simulator's regrouping of a request's routing (``schedule.batch.request_routing``).

A kernel is plain Python over numpy arrays and scalars; :func:`kernel` compiles it on first call
and caches the machine code on disk (``__pycache__``, else numba's user cache), so later processes
load it instead of compiling. ``NUMBA_DISABLE_JIT=1`` runs the same functions as Python (slow, for
debugging). Kernels do no timing and hold no state: policies stay pure.
"""

from __future__ import annotations

import numpy as np
from numba import njit

INSERTION_SORT_MAX = 128  # rows up to this length are insertion-sorted by stable_argsort


def kernel(fn):
    """Compile ``fn`` as a cached nopython kernel (IEEE arithmetic: no fastmath)."""
    return njit(cache=True, nogil=True)(fn)


@kernel
def stable_argsort(keys):
    """``np.argsort(keys, kind="stable")``. The short rows a policy sorts per decode layer (tens of experts) are
    insertion-sorted, faster at those lengths than numba's merge sort; longer rows (a prefill layer's hundreds of
    experts) are merge-sorted. Equal keys keep their order either way."""
    n = keys.shape[0]
    if n > INSERTION_SORT_MAX:
        return np.argsort(keys, kind="mergesort")
    order = np.empty(n, np.int64)
    for i in range(n):
        v = keys[i]
        k = i
        while k > 0 and keys[order[k - 1]] > v:
            order[k] = order[k - 1]
            k -= 1
        order[k] = i
    return order
