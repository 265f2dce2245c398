"""Background loads on the host: a memory stream in threads, and the CPU engine called in a process of its own."""

import time

import pytest

from dllm_offload_sim.profiler.host_load import EngineLoad, MemoryLoad
from tests.simkit import tiny_topology


def test_a_memory_load_streams_host_memory_while_it_is_entered():
    load = MemoryLoad(threads=2, mib=4)
    with load:
        time.sleep(0.05)
    assert load.gbps > 0 and not any(w.is_alive() for w in load._workers)
    with pytest.raises(ValueError, match="threads and mib must be >= 1"):
        MemoryLoad(threads=0)


def test_an_engine_load_calls_the_engine_only_while_it_is_entered():
    """Entered, the engine calls; work however short runs beside at least one call (entering waits for one to begin,
    leaving for it to end); left, it is idle; a process that ended is named."""
    load = EngineLoad(tiny_topology(n_moe=1, n_experts=8), "torch", threads=1, experts=2, tokens=1).start()
    try:
        with load:
            pass
        assert load.calls_per_s > 0 and load._calls.value == load._started.value
        with load:
            time.sleep(0.5)
        assert load.calls_per_s > 0
        n = load._calls.value
        time.sleep(0.5)
        assert load._calls.value == n  # paused: the call under way finished before it left
        load._proc.terminate()  # the engine's process ends while the load is entered: no load ran beside
        load._proc.join(10)
        with pytest.raises(RuntimeError, match="process ended"):
            with load:
                pass
    finally:
        load.close()
    assert not load._proc.is_alive()


def test_an_engine_load_whose_process_fails_says_so():
    load = EngineLoad(tiny_topology(n_moe=1, n_experts=8), "no-such-engine", threads=1)
    with pytest.raises(RuntimeError, match="process ended"):
        load.start(timeout_s=60)
