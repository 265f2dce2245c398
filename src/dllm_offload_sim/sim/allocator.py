"""How a simulating process allocates memory: large blocks mapped on their own, so a long run's peak stays bounded.

A simulation reads each request's routing as arrays of tens of megabytes and frees them once the request ran, while
small objects it keeps (the per-forward columns, the layer shapes' table) are allocated between them. glibc's
allocator raises its mapping threshold each time a mapped block is freed (up to 32 MiB), after which such blocks come
from the heap, where the small objects left between them keep the freed space from going back to the system: the
peak grows with the number of requests. Holding the threshold at ``MMAP_THRESHOLD_BYTES`` (``mallopt``) keeps the
request-sized blocks mapped and unmapped on their own; holding the heap's trim threshold at ``TRIM_THRESHOLD_BYTES``
keeps the heap from being given back and faulted in again between forwards (a lower mapping threshold, or the default
trim threshold, made runs up to 40% slower). pyarrow's buffers go through the same allocator (its system pool) rather
than a pool of its own that keeps what it freed. ``docs/performance.md`` has the peaks with and without.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD_BYTES = 4 << 20
TRIM_THRESHOLD_BYTES = 64 << 20
# glibc reads these when a process starts (a worker that is not forked)
ENV = {"MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD_BYTES, "MALLOC_TRIM_THRESHOLD_": TRIM_THRESHOLD_BYTES}


def map_large_blocks() -> bool:
    """Map every block of ``MMAP_THRESHOLD_BYTES`` or more on its own and keep up to ``TRIM_THRESHOLD_BYTES`` of free
    heap, in this process and in the processes it starts (through the environment), and route pyarrow's buffers
    through the system allocator. Leaves the allocator alone where the user set either threshold in the environment.
    Returns whether this process's thresholds were set (glibc on Linux)."""
    if not sys.platform.startswith("linux") or any(k in os.environ for k in ENV):
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    if not (
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    ):
        return False
    os.environ.update({k: str(v) for k, v in ENV.items()})
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())
    return True
