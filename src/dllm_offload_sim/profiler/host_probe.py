"""Reference probes of the host a profile is measured on, stamped in the profile.

Host-bound curves (CPU experts, CPU dispatch) move between profiling runs on a shared VM. These probes
say whether the host moved too: plain PyTorch work that none of the runtime's code touches (an expert
FFN on the main thread, a memory copy), and the share of CPU time the hypervisor stole meanwhile
(``/proc/stat``'s ``steal`` column). ``dllm-profile-compare`` prints two profiles' probes side by
side, and ``bench/bench_profile_repro.py`` repeats a curve with a probe before and after each repeat.
"""

from __future__ import annotations

import os
import statistics
import time

import torch

from dllm_offload_sim.runtime.cpu_experts import cpu_expert_ffn


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
    return {"ref_expert_1tok_us": round(1e6 * reference_expert_seconds(host, 1), 2),
            "ref_expert_8tok_us": round(1e6 * reference_expert_seconds(host, 8), 2),
            "mem_gbps": round(memory_bandwidth_gbps(), 2),
            "loadavg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
            "threads": torch.get_num_threads()}
