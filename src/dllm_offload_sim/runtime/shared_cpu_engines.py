"""CPU engines built once and lent to the replays of a validation run and its repeats (or a whole sweep).

Building the native engine packs every expert's weights of the host experts for kt-kernel's kernels; a replay
that built its own engine would redo that for every repeat of every run. An engine decides nothing and holds no
state between calls but its buffers, so one engine serves any number of replays in turn.
"""

from __future__ import annotations

from dllm_offload_sim.runtime.cpu_engine import profiled_cpu_engine
from dllm_offload_sim.runtime.host_experts import HostExperts


class SharedCpuEngines:
    """The CPU engines of one sweep, one per (engine, workers, host experts, device), each as the profile measured
    it (:func:`profiled_cpu_engine`); an engine too small for a replay's largest forward is replaced by a larger
    one. :meth:`close` stops them all."""

    def __init__(self):
        self._engines: dict = {}  # key -> (engine, the tokens one call may hold)
        self._used: set = set()  # ids of the engines lent before

    def first_lending(self, engine) -> bool:
        """Whether ``engine`` is lent for the first time (True once per engine): a fresh engine's first calls run
        slower than its later ones, so a caller that times it may warm it first."""
        if id(engine) in self._used:
            return False
        self._used.add(id(engine))
        return True

    def get(self, cost, host: HostExperts, device, engine: str | None, workers: int, max_tokens: int):
        """An engine for replays of ``cost``'s profile over ``host`` on ``device`` whose calls hold up to
        ``max_tokens`` tokens."""
        key = (
            engine or cost.cpu_engine,
            cost.cpu_ordering,
            cost.cpu_expert_threads,
            int(workers),
            id(host),
            str(device),
        )
        held = self._engines.get(key)
        if held is not None and held[1] >= max_tokens:
            return held[0]
        if held is not None:
            held[0].close()
            self._used.discard(id(held[0]))
        e = profiled_cpu_engine(cost, host, device, engine, workers, max_tokens=max_tokens)
        self._engines[key] = (e, max_tokens)
        return e

    def close(self) -> None:
        """Stop every engine (their threads and packed weights); the pool can be used again after."""
        for e, _ in self._engines.values():
            e.close()
        self._engines.clear()
        self._used.clear()
