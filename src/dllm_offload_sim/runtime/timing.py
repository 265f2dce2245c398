"""Timing primitives: medians over repeats after warm-up, with CUDA events on a GPU."""

from __future__ import annotations

import statistics
import time

import torch


def median_seconds(
    fn, device, reps: int = 20, warmup: int = 3, stream=None, pipelined: bool = False, rounds: int = 5
) -> float:
    """Median wall time of ``fn()`` (CUDA events around each call on a GPU, synchronised).

    ``pipelined``: the cost of one call inside a stream of back-to-back calls, as the runtime issues a
    layer's work (launch overhead overlaps the previous call's GPU time): the median over ``rounds``
    rounds of (time of ``reps`` calls issued without synchronising) / ``reps``.
    """
    cuda = torch.device(device).type == "cuda"
    for _ in range(warmup):
        fn()
    if cuda and pipelined:
        per_call = []
        for _ in range(rounds):
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(stream) if stream is not None else s.record()
            for _ in range(reps):
                fn()
            e.record(stream) if stream is not None else e.record()
            e.synchronize()
            per_call.append(s.elapsed_time(e) / 1e3 / reps)
        return statistics.median(per_call)
    if cuda:
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            (stream or torch.cuda.current_stream()).synchronize()
            s.record(stream) if stream is not None else s.record()
            fn()
            e.record(stream) if stream is not None else e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
        return statistics.median(times)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def host_launch_seconds(device, launches: int = 200, rounds: int = 5) -> float:
    """Host time to issue one trivial operator (an in-place add on a 1 KiB tensor): the median over
    ``rounds`` of the time to issue ``launches`` of them back to back after a synchronisation, per
    launch. On a GPU that is the host's speed at launching kernels, of which the runtime's grouped
    calls and copies are made (about 10 us on the shared H200 host, drifting with its load); the
    profiler stamps it, the replay measures it again, and the validator reports the two side by side."""
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    t = torch.zeros(256, device=dev)
    per = []
    for _ in range(rounds + 1):  # the first round warms up
        if cuda:
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(launches):
            t.add_(1.0)
        per.append((time.perf_counter() - t0) / launches)
    if cuda:
        torch.cuda.synchronize(dev)
    return statistics.median(per[1:])


def median_seconds_after_idle(fn, reps: int = 20, warmup: int = 3, idle_s: float = 2e-3) -> float:
    """Median host wall time of ``fn()`` when each call follows ``idle_s`` seconds of sleep (thread
    pools gone idle, as between a runtime's layers), after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        time.sleep(idle_s)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleaved_medians(fns, time_once, passes: int = 5) -> list:
    """The median of ``time_once(fn)`` for every ``fn`` over ``passes`` round-robin passes through all of
    them. A slow spell of a shared host then touches every point of a curve a little instead of a run
    of neighbouring points (which is what made two profiling runs disagree by up to 70%)."""
    samples = [[] for _ in fns]
    for _ in range(passes):
        for i, fn in enumerate(fns):
            samples[i].append(time_once(fn))
    return [statistics.median(s) for s in samples]


def graphed(fn, device):
    """``fn`` captured as a CUDA graph (its inputs must be static tensors), returned as a replay
    callable; on a CPU ``fn`` itself. The runtime replays the non-expert part of a layer and the
    lm-head this way, so that they cost GPU time rather than one Python dispatch per operator."""
    if torch.device(device).type != "cuda":
        return fn
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay
