"""Copies issued through the CUDA runtime: host-to-device batches in one call, and single copies either way.

``torch``'s ``copy_`` of a pinned host tensor costs ~9 us of host time per copy on the H200 host (the dispatcher,
stream checks, an event that keeps the pinned block alive), where a layer's demand copies need only
``cudaMemcpyBatchAsync``: one call over all of them, ~2.5 us per copy at 24 (docs/performance.md;
``bench/bench_replay_paths.py --gpu-only`` times the ways side by side). The batch call has a fixed cost of its own
(~30-40 us of host time for one copy on the H100 host, against ~18 us for one ``cudaMemcpyAsync``), so a call of at
most ``SINGLE_UP_TO`` copies (a prefetch, a layer with few misses) goes one ``cudaMemcpyAsync`` each. A larger call
issues its first copy alone (~17 us of host time), then the rest in one batch (~40-160 us at 1-24 copies), so that the
copy engine has a copy to work on while the host issues the batch; how early the batch's own first copy starts was not
measured. The
runtime's host experts and slots live as long as the runtime, so no event has to guard them.

:func:`batch_copier` finds the ``libcudart`` that torch loaded and returns a :class:`BatchCopier` over its
``cudaMemcpyBatchAsync`` (CUDA 12.8 and later; 13.x dropped the ``failIdx`` argument), or over one
``cudaMemcpyAsync`` per copy where the batch call is missing, or ``None`` where there is no CUDA runtime (a CPU
host): then the caller copies with torch. The native CPU engine issues its activations' and results' copies with
:meth:`BatchCopier.copy_one` for the same reason.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

H2D = 1  # cudaMemcpyHostToDevice
DEFAULT = 4  # cudaMemcpyDefault: the direction follows from the addresses (unified addressing)
SRC_ACCESS_ORDER_STREAM = 1  # cudaMemcpySrcAccessOrderStream: the sources are read in stream order
# copies a call issues one cudaMemcpyAsync each; more go in one batch (the cheaper way either side,
# bench/bench_replay_paths.py --gpu-only: "copy issue of n experts")
SINGLE_UP_TO = 4


class _MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _MemcpyAttributes(ctypes.Structure):
    _fields_ = [
        ("srcAccessOrder", ctypes.c_int),
        ("srcLocHint", _MemLocation),
        ("dstLocHint", _MemLocation),
        ("flags", ctypes.c_uint),
    ]


def loaded_cudart(maps: str = "/proc/self/maps") -> str | None:
    """Path of the ``libcudart`` this process has loaded (torch's), or None."""
    try:
        text = Path(maps).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        path = line.split()[-1] if line.split() else ""
        if "libcudart.so" in Path(path).name:
            return path
    return None


class BatchCopier:
    """Issues a batch of host-to-device copies (``dst``, ``src`` addresses, ``nbytes`` each) on a CUDA stream with one
    runtime call (``batched``) or one call per copy."""

    def __init__(self, lib: ctypes.CDLL, version: int, single_up_to: int = SINGLE_UP_TO):
        """``single_up_to``: a call of at most this many copies issues one ``cudaMemcpyAsync`` each."""
        self.lib, self.version = lib, version
        self.batched = hasattr(lib, "cudaMemcpyBatchAsync")
        self.single_up_to = int(single_up_to)
        # a batch's first copy goes alone, ahead of the batch call (the module's docstring)
        self.lead_single = True
        self._attr = _MemcpyAttributes(
            SRC_ACCESS_ORDER_STREAM, _MemLocation(0, 0), _MemLocation(0, 0), 0
        )  # no hints
        self._first = (ctypes.c_size_t * 1)(0)  # the one attribute set applies from copy 0 on
        lib.cudaMemcpyAsync.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_void_p,
        ]

    def copy(self, dst: np.ndarray, src: np.ndarray, nbytes: int, stream: int) -> None:
        """Copy ``nbytes`` from each host address of ``src`` to the device address at the same place of ``dst``
        (uint64 arrays) on ``stream`` (a ``cudaStream_t``): one batch call, or one call per copy where the runtime has
        no batch call or there are at most ``single_up_to`` copies (with ``lead_single``, a batch's first copy goes
        alone ahead of it); raises ``RuntimeError`` with the CUDA error code."""
        n = len(dst)
        if n == 0:
            return
        if not self.batched or n <= self.single_up_to:
            for d, s in zip(dst.tolist(), src.tolist()):
                self._check(self.lib.cudaMemcpyAsync(d, s, nbytes, H2D, stream), "cudaMemcpyAsync")
            return
        if self.lead_single and n > 1:
            self._check(
                self.lib.cudaMemcpyAsync(int(dst[0]), int(src[0]), nbytes, H2D, stream), "cudaMemcpyAsync"
            )
            dst, src, n = dst[1:], src[1:], n - 1
        d = np.ascontiguousarray(dst, np.uint64)
        s = np.ascontiguousarray(src, np.uint64)
        sizes = np.full(n, nbytes, np.uint64)
        ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
        args = [
            ptr(d),
            ptr(s),
            ptr(sizes),
            ctypes.c_size_t(n),
            ctypes.byref(self._attr),
            self._first,
            ctypes.c_size_t(1),
        ]
        if self.version < 13000:  # 12.8 / 12.9: a failIdx out-argument before the stream
            args.append(ctypes.byref(ctypes.c_size_t(0)))
        self._check(self.lib.cudaMemcpyBatchAsync(*args, ctypes.c_void_p(stream)), "cudaMemcpyBatchAsync")

    def copy_one(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """Copy ``nbytes`` from address ``src`` to ``dst`` on ``stream``, either direction (host memory pinned):
        one ``cudaMemcpyAsync``, without ``Tensor.copy_``'s dispatch or the pinned allocator's event bookkeeping."""
        self._check(self.lib.cudaMemcpyAsync(dst, src, nbytes, DEFAULT, stream), "cudaMemcpyAsync")

    @staticmethod
    def _check(code: int, call: str) -> None:
        if code:
            raise RuntimeError(f"{call} failed with CUDA error {code}")


def batch_copier(device) -> BatchCopier | None:
    """A :class:`BatchCopier` on the CUDA runtime torch loaded, for ``device`` (a CUDA ``torch.device``), or None
    where there is none (a CPU host, or no ``libcudart`` in this process)."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    torch.cuda.init()
    path = loaded_cudart()
    if path is None:
        return None
    lib = ctypes.CDLL(path)
    version = ctypes.c_int(0)
    if lib.cudaRuntimeGetVersion(ctypes.byref(version)) != 0:
        return None
    return BatchCopier(lib, version.value)
