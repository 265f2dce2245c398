"""Reference probes of the host a profile is measured on, stamped in the profile.

Host-bound curves (CPU experts, CPU dispatch) move between profiling runs on a shared VM. These probes
say whether the host moved too: plain PyTorch work that none of the runtime's code touches (an expert
FFN on the main thread, a memory copy), and the share of CPU time the hypervisor stole meanwhile
(``/proc/stat``'s ``steal`` column). ``dllm-profile-compare`` prints two profiles' probes side by
side, and ``bench/bench_profile_repro.py`` repeats a curve with a probe before and after each repeat.

The CPU engine's own probe (:func:`cpu_engine_probe_seconds`) times one fixed call of the engine the CPU curve
measures, just before and after the curve and before each validation replay, so a replay's CPU path can be set
against the engine's speed at that moment rather than the host's memory copy alone.
"""

from __future__ import annotations

import itertools
import os
import statistics
import time

import numpy as np
import torch

from dllm_offload_sim.runtime.cpu_experts import cpu_expert_ffn
from dllm_offload_sim.runtime.timing import median_seconds_after_idle

CPU_PROBE_CALL = (32, 1)  # (experts, tokens each) of the CPU engine probe's call
CPU_IDLE_S = 2e-3  # idle spell before each timed CPU call (the engine waits between a runtime's layers)
SETTLE_ROUNDS, SETTLE_TOL = (
    12,
    0.03,
)  # settle_engine: at most this many probe rounds, until two agree this closely


def cpu_times() -> tuple[int, int] | None:
    """(all CPU time, stolen CPU time) in clock ticks since boot, summed over CPUs; None without /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return sum(ticks), ticks[7]


class StealMeter:
    """The share of CPU time stolen by the hypervisor between construction and :meth:`fraction`."""

    def __init__(self):
        self.start = cpu_times()

    def fraction(self) -> float | None:
        end = cpu_times()
        if self.start is None or end is None or end[0] <= self.start[0]:
            return None
        return (end[1] - self.start[1]) / (end[0] - self.start[0])


def memory_bandwidth_gbps(mib: int = 256, reps: int = 7) -> float:
    """Host memory bandwidth: bytes read plus written by a copy of ``mib`` MiB, over the median copy time."""
    n = mib * (1 << 20) // 4
    src, dst = torch.ones(n), torch.empty(n)
    dst.copy_(src)  # fault the pages in
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return 2 * n * 4 / statistics.median(times) / 1e9


def engine_call(
    engine, n_experts: int, hidden: int, experts: int, tokens: int, dtype=torch.bfloat16, counter=None
):
    """A callable that runs one call of the CPU ``engine`` as the replay does (``submit``, ``finish`` and, on a GPU,
    a synchronisation): ``experts`` experts of layer 0 with ``tokens`` rows each, activations on the engine's device,
    each call the next ``experts`` experts of ``n_experts`` (``counter``: an iterator shared between callables), so
    that their weights come from DRAM."""
    nxt = counter if counter is not None else itertools.count()
    T = experts * tokens
    cuda = engine.device.type == "cuda"
    x = torch.randn(T, hidden, dtype=dtype, device=engine.device)
    local = (np.arange(T) // tokens).reshape(
        T, 1
    )  # expert i of the call gets rows i*tokens .. (i+1)*tokens - 1
    w = np.ones((T, 1), np.float32)
    out = torch.zeros((T, hidden), dtype=torch.float32, device=engine.device)

    def call():
        ids = (next(nxt) * experts + np.arange(experts)) % n_experts
        engine.finish(engine.submit(0, x, ids[local], w, ids.tolist()), out)
        if cuda:
            torch.cuda.synchronize(engine.device)

    return call


def cpu_engine_probe_seconds(
    engine, n_experts: int, hidden: int, dtype=torch.bfloat16, reps: int = 7, warmup: int = 2
) -> float:
    """Median seconds of the CPU engine probe's call (``CPU_PROBE_CALL``, at most ``n_experts`` experts) on
    ``engine``, each after ``CPU_IDLE_S`` idle, as the profile's CPU curve times its calls; NaN where the engine was
    sized for fewer rows than the call has (its ``max_tokens``: a replay of forwards that small)."""
    experts, tokens = min(CPU_PROBE_CALL[0], n_experts), CPU_PROBE_CALL[1]
    if experts * tokens > getattr(engine, "max_tokens", experts * tokens):
        return float("nan")
    call = engine_call(engine, n_experts, hidden, experts, tokens, dtype)
    return median_seconds_after_idle(call, reps, warmup, CPU_IDLE_S)


def settle_engine(
    engine,
    n_experts: int,
    hidden: int,
    dtype=torch.bfloat16,
    rounds: int = SETTLE_ROUNDS,
    tol: float = SETTLE_TOL,
) -> list[float]:
    """Run the engine probe's call (:func:`cpu_engine_probe_seconds`) in rounds until two rounds in a row agree within
    ``tol`` (a fraction), at most ``rounds``; the rounds' medians in order (empty where the engine cannot take the
    call). A fresh engine's first calls run slower than its later ones (its threads and buffers start cold), so the
    profiler times the curve once it has settled."""
    out: list[float] = []
    for _ in range(rounds):
        v = cpu_engine_probe_seconds(engine, n_experts, hidden, dtype)
        if v != v:
            return []
        out.append(v)
        if len(out) >= 2 and abs(out[-1] - out[-2]) <= tol * out[-2]:
            break
    return out


def reference_expert_seconds(host, tokens: int = 1, reps: int = 20, warmup: int = 3) -> float:
    """Median time of one plain expert FFN (``cpu_expert_ffn``) on the calling thread, torch's threads,
    a different expert of ``host``'s layer 0 each call (weights from DRAM)."""
    E = host.topo.n_experts
    x = torch.randn(tokens, host.topo.hidden, dtype=host.w13.dtype)
    times = []
    for i in range(warmup + reps):
        w13, w2 = host.expert(0, (i * 7) % E)
        t0 = time.perf_counter()
        cpu_expert_ffn(x, w13, w2)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def host_probe(host) -> dict:
    """The reference numbers stamped in a profile: plain expert FFN at 1 and 8 tokens (us), host memory
    bandwidth (GB/s), the 1-minute load average and the torch threads they ran with."""
    return {
        "ref_expert_1tok_us": round(1e6 * reference_expert_seconds(host, 1), 2),
        "ref_expert_8tok_us": round(1e6 * reference_expert_seconds(host, 8), 2),
        "mem_gbps": round(memory_bandwidth_gbps(), 2),
        "loadavg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "threads": torch.get_num_threads(),
    }
