"""Background loads on the host, beside which a bench times the runtime's own host work.

The runtime's host steps (bookkeeping, issuing copies and grouped calls) take longer than the profile's charge in the
validation runs that use the CPU expert engine (docs/validation.md). Two loads tell whether the engine's company is
why:
:class:`MemoryLoad` streams host memory in threads of this process, as the engine streams expert weights;
:class:`EngineLoad` runs the CPU engine itself, call after call, in a process of its own, so that its threads take
the cores and the memory system as in a cooperative run. ``bench/bench_host_work.py --beside`` uses them.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

import numpy as np

from dllm_offload_sim.profiler.host_probe import engine_call
from dllm_offload_sim.runtime.cpu_engine import make_cpu_engine
from dllm_offload_sim.runtime.host_experts import HostExperts
from dllm_offload_sim.traces.topology import ModelTopology


class MemoryLoad:
    """A background load that streams host memory: ``threads`` threads each copying a ``mib`` MiB array into another
    (NumPy drops the GIL while it copies), from entering the context to leaving it; ``gbps`` is the bandwidth it
    moved (bytes read and written over the seconds it ran)."""

    def __init__(self, threads: int, mib: int = 64):
        if threads < 1 or mib < 1:
            raise ValueError(f"MemoryLoad: threads and mib must be >= 1, got {threads}, {mib}")
        self.threads, self.nbytes = threads, mib << 20
        self.gbps = float("nan")
        self._stop = threading.Event()
        self._copies = [0] * threads
        self._workers: list[threading.Thread] = []

    def _stream(self, i: int) -> None:
        src = np.ones(self.nbytes // 8)
        dst = np.empty_like(src)
        while not self._stop.is_set():
            np.copyto(dst, src)
            self._copies[i] += 1

    def __enter__(self) -> "MemoryLoad":
        self._stop.clear()
        self._copies = [0] * self.threads
        self._workers = [
            threading.Thread(target=self._stream, args=(i,), daemon=True) for i in range(self.threads)
        ]
        self._t0 = time.perf_counter()
        for w in self._workers:
            w.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for w in self._workers:
            w.join()
        self.gbps = 2 * self.nbytes * sum(self._copies) / (time.perf_counter() - self._t0) / 1e9


def _engine_loop(
    topo: dict, engine: str, threads: int | None, experts: int, tokens: int, run, ready, started, calls
) -> None:
    """The child process of :class:`EngineLoad`: an engine over host experts of ``topo``'s shapes (one real layer),
    called over ``experts`` experts x ``tokens`` rows while the flag ``run`` is 1; ``started`` and ``calls`` count the
    calls begun and finished."""
    t = ModelTopology.from_dict(topo)
    host = HostExperts(t, n_real_layers=1, pin=False)
    eng = make_cpu_engine(engine, host, "cpu", threads=threads, max_tokens=experts * tokens)
    call = engine_call(eng, t.n_experts, t.hidden, experts, tokens, host.w13.dtype)
    call()  # warm
    ready.set()
    while True:  # until the parent terminates this process
        if run.value:
            started.value += 1
            call()
            calls.value += 1
        else:
            time.sleep(1e-3)


class EngineLoad:
    """A background load that runs the CPU expert engine: a child process with an engine of its own (``engine``,
    ``threads``) over host experts of ``topo``'s shapes, calling it over ``experts`` experts x ``tokens`` rows, one call
    after another, while the context is entered (the process starts once, :meth:`start`, and stops at
    :meth:`close`). Entering returns once the engine has begun a call, and leaving waits for the call under way to
    finish, so the timed work always ran beside at least one; ``calls_per_s`` is how often it called meanwhile."""

    def __init__(
        self, topo: ModelTopology, engine: str, threads: int | None, experts: int = 32, tokens: int = 16
    ):
        ctx = mp.get_context("spawn")
        # the run flag and the call count have one writer each and no lock, so that a child ended at any point leaves
        # nothing held that the parent would wait on
        self._run, self._ready = ctx.RawValue("b", 0), ctx.Event()
        self._started, self._calls = ctx.RawValue("q", 0), ctx.RawValue("q", 0)
        self._proc = ctx.Process(
            target=_engine_loop,
            daemon=True,
            args=(
                topo.to_dict(),
                engine,
                threads,
                experts,
                tokens,
                self._run,
                self._ready,
                self._started,
                self._calls,
            ),
        )
        self.calls_per_s = float("nan")

    def start(self, timeout_s: float = 300.0) -> "EngineLoad":
        """Start the engine's process and wait until its engine has made a first call; RuntimeError where the
        process ends first or is not ready within ``timeout_s``."""
        self._proc.start()
        t0 = time.perf_counter()
        while not self._ready.wait(0.5):
            ended = not self._proc.is_alive()
            if ended or time.perf_counter() - t0 > timeout_s:
                why = (
                    f"ended (exit code {self._proc.exitcode})"
                    if ended
                    else f"was not ready within {timeout_s:.0f} s"
                )
                self.close()
                raise RuntimeError(f"EngineLoad: the engine's process {why} before its first call")
        return self

    def _wait(self, done, what: str, timeout_s: float = 60.0) -> None:
        """Poll until ``done()``; RuntimeError where the engine's process ends first or ``timeout_s`` passes."""
        t0 = time.perf_counter()
        while not done():
            if not self._proc.is_alive() or time.perf_counter() - t0 > timeout_s:
                why = (
                    f"ended (exit code {self._proc.exitcode})"
                    if not self._proc.is_alive()
                    else f"did not within {timeout_s:.0f} s"
                )
                raise RuntimeError(f"EngineLoad: the engine's process {why} {what}")
            time.sleep(1e-4)

    def __enter__(self) -> "EngineLoad":
        n0, self._n0, self._t0 = self._started.value, self._calls.value, time.perf_counter()
        self._run.value = 1
        try:
            self._wait(lambda: self._started.value > n0, "before beginning a call beside the timed work")
        except RuntimeError:
            self._run.value = 0
            raise
        return self

    def __exit__(self, *exc) -> None:
        """Pause the engine once its call under way has finished; RuntimeError where its process ended meanwhile
        (what ran beside was no load)."""
        self._run.value = 0
        try:
            self._wait(lambda: self._calls.value >= self._started.value, "while it ran beside the timed work")
        except RuntimeError:
            if exc[0] is None:
                raise
        self.calls_per_s = (self._calls.value - self._n0) / (time.perf_counter() - self._t0)

    def close(self) -> None:
        """Stop the engine's process."""
        if self._proc.is_alive():
            self._proc.terminate()
        self._proc.join(10)
