"""Compiled numeric kernels for the per-layer hot paths of policies (numba, ``nopython`` mode).

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
