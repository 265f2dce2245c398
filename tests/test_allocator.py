"""``sim.allocator``: a simulating process maps large blocks on its own, and leaves a user's setting alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CHECK = """
import os, sys
from dllm_offload_sim.sim.allocator import ENV, map_large_blocks
before = os.environ.get("MALLOC_MMAP_THRESHOLD_")
set_here = map_large_blocks()
import pyarrow as pa
print(set_here, before, os.environ.get("MALLOC_MMAP_THRESHOLD_"), os.environ.get("MALLOC_TRIM_THRESHOLD_"),
      pa.default_memory_pool().backend_name)
"""


def _run(env):
    out = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_large_blocks_are_mapped_in_this_process_and_those_it_starts():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    assert _run(env) == ["True", "None", str(4 << 20), str(64 << 20), "system"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_threshold_the_user_set_is_left_as_it_is():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    assert _run(env)[:4] == ["False", "65536", "65536", "None"]
