"""How a simulating process allocates memory: large blocks mapped on their own, so a long run's peak stays bounded.

A simulation reads each request's routing as arrays of megabytes and frees them once the request ran, while small
objects it keeps (the per-forward columns, the layer shapes' table) are allocated between them. glibc's allocator
raises its mapping threshold each time a mapped block is freed, after which such blocks come from the heap, where the
small objects left between them keep the freed space from going back to the system: the peak grows with the number
of requests. Holding the threshold (``mallopt(M_MMAP_THRESHOLD)``) keeps every block of 1 MiB or more mapped and
unmapped on its own; pyarrow's buffers go through the same allocator (its system pool) rather than a pool of its own
that keeps what it freed. ``docs/performance.md`` has the peaks with and without.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD_BYTES = 1 << 20
ENV = "MALLOC_MMAP_THRESHOLD_"  # glibc reads it when a process starts


def map_large_blocks() -> bool:
    """Map every block of ``MMAP_THRESHOLD_BYTES`` or more on its own in this process and in the processes it starts
    (through the environment), and route pyarrow's buffers through the system allocator. Leaves a threshold the user
    set (``MALLOC_MMAP_THRESHOLD_``) as it is. Returns whether this process's threshold was set (glibc on Linux)."""
    if not sys.platform.startswith("linux") or ENV in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    if not mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES):
        return False
    os.environ[ENV] = str(MMAP_THRESHOLD_BYTES)
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())
    return True
