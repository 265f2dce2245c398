"""Compiled numeric kernels for hot paths (numba, ``nopython`` mode): policies' per-layer arithmetic and the
simulator's regrouping of a request's routing (``sim.batch.request_routing``).

A kernel is plain Python over numpy arrays and scalars; :func:`kernel` compiles it on first call
and caches the machine code on disk (``__pycache__``, else numba's user cache), so later processes
load it instead of compiling. ``NUMBA_DISABLE_JIT=1`` runs the same functions as Python (slow, for
debugging). Kernels do no timing and hold no state: policies stay pure.
"""

from __future__ import annotations

from numba import njit


def kernel(fn):
    """Compile ``fn`` as a cached nopython kernel (IEEE arithmetic: no fastmath)."""
    return njit(cache=True, nogil=True)(fn)
