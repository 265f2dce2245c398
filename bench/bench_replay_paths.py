"""Where the replay's time goes that the profile does not see (run on the GPU host).

    python bench/bench_replay_paths.py [--model mini] [--json out.json]

1. The host's time for each step of a grouped call (eager, and the replay's captured graph:
   ``runtime.grouped_graph``) and of a demand copy; a grouped GPU call split into the host's part (plan + launches) and the GPU's part (CUDA-graph
   replay with a prebuilt plan), next to the pipelined per-call time that the profile records; and
   a call over resident experts issued right after a layer's demand copies vs with no copies (does
   its plan upload queue behind the copies?).
2. CPU experts: the profile's isolated expert (back-to-back calls on the main thread) vs the
   replay's way of running a layer's CPU experts (``CpuExperts.run`` on a job list, from the worker
   thread, after an idle gap, with the main thread busy, with fewer intra-op threads); and layer-sized
   calls (1 .. 64 experts, weights from DRAM) at torch's default threads and fewer; and (GPU) a
   decode layer's CPU experts while the main thread issues demand copies, Python vs TorchScript.
3. (GPU) Expert copies the profile's way (one ``copy_`` each, back to back) and the replay's (a decode layer's
   24 and a prefill layer's 226 demand copies through ``ExpertCopier``, and the 24 with one torch copy or one
   ``cudaMemcpyAsync`` each instead of the batched issue), interleaved: wire time and the host's issue time per copy;
   and the host's time to issue 1 .. 24 copies as one batch call and as one call each (where the copier switches).
4. The host's slot bookkeeping of a decode layer (25 copies in, 25 residents out), as the replay does it (any
   host).
Prints one line per measurement and, with ``--json``, writes them all.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from dllm_offload_sim.runtime.timing import graphed, median_seconds
from dllm_offload_sim.traces.topology import topology_preset
from dllm_offload_sim.runtime.copy_engine import ExpertCopier
from dllm_offload_sim.runtime.cpu_experts import CpuExperts, cpu_expert_ffn
from dllm_offload_sim.runtime.grouped import grouped_ffn, plan_from_numpy
from dllm_offload_sim.runtime.host_experts import HostExperts
from dllm_offload_sim.runtime.slot_pool import SlotPool
from dllm_offload_sim.traces.cli import HelpFormatter

REPS = 20  # timed calls per point (median)


def grouped_parts(topo, host, dev, out: dict) -> None:
    H, I, E = topo.hidden, topo.moe_intermediate, topo.n_experts
    pool = SlotPool(E, H, I, device=dev)
    for s in range(E):
        w13, w2 = host.expert(0, s)
        pool.w13[s].copy_(w13)
        pool.w2[s].copy_(w2)
    host_steps(host, pool, H, E, dev, out)
    host_vs_device(pool, H, E, dev, out)
    plan_behind_copies(host, pool, H, E, dev, out)
    copy_rates(host, pool, dev, out)
    copy_issue_by_count(host, pool, dev, out)


def host_steps(host, pool, H, E, dev, out: dict) -> None:
    """The host's time for each step of a grouped call (32 experts x 2 tokens) and of a demand copy,
    each issued with the GPU idle: which part of the ~0.3-0.7 ms host time of a call is what."""
    import torch.nn.functional as F

    from dllm_offload_sim.runtime.grouped import _packed_upload

    T, n = 64, 32
    x = torch.randn((T, H), device=dev, dtype=torch.bfloat16)
    ids = (np.arange(T) // 2).reshape(T, 1)
    w = np.ones((T, 1), np.float32)
    lut = np.full(E, -1, np.int64)
    lut[:n] = np.arange(n)
    plan = plan_from_numpy(ids, w, lut, E, dev)
    lo, hi, p0, p1, offs = plan.windows[0]
    i = pool.w2.shape[2]
    xs = x[plan.token]
    h = torch._grouped_mm(xs, pool.w13[lo:hi].transpose(1, 2), offs=offs)
    a = F.silu(h[:, :i]) * h[:, i:]
    y = torch._grouped_mm(a, pool.w2[lo:hi].transpose(1, 2), offs=offs)
    o = torch.zeros_like(x)
    copier = ExpertCopier(host, pool, dev)
    from dllm_offload_sim.runtime.grouped_graph import GroupedGraph

    gg = GroupedGraph(x, torch.zeros((T + 1, H), device=dev, dtype=x.dtype), 1, E, (0, E), pool.w13, pool.w2)
    arrays = [np.zeros(3 * T, np.int64), np.zeros(T, np.float32), np.zeros(E, np.int32)]
    steps = {
        "whole grouped call": lambda: grouped_ffn(x, pool.w13, pool.w2, plan_from_numpy(ids, w, lut, E, dev)),
        "plan (numpy + one pinned upload)": lambda: plan_from_numpy(ids, w, lut, E, dev),
        "pinned upload of 3 arrays": lambda: _packed_upload(arrays, dev),
        "pinned empty 4 KiB": lambda: torch.empty(4096, dtype=torch.uint8, pin_memory=True),
        "gather x[token]": lambda: x[plan.token],
        "grouped_mm w13": lambda: torch._grouped_mm(xs, pool.w13[lo:hi].transpose(1, 2), offs=offs),
        "silu * up": lambda: F.silu(h[:, :i]) * h[:, i:],
        "grouped_mm w2": lambda: torch._grouped_mm(a, pool.w2[lo:hi].transpose(1, 2), offs=offs),
        "index_add_ weighted": lambda: o.index_add_(0, plan.token, y * plan.weight.to(y.dtype)[:, None]),
        "one tiny kernel (add_)": lambda: o.add_(1.0),
        "CUDA-graph replay of the whole call (plan prebuilt)": graphed(
            lambda: grouped_ffn(x, pool.w13, pool.w2, plan, out=o), dev
        ),
        "graphed call: upload + replay (the replay's call)": lambda: gg.run(ids, w, lut),
        "graphed call: upload of routing + slot table": lambda: gg.upload(ids, w, lut),
        "graphed call: replay alone": gg.replay,
        "demand copy of 1 expert (one copy + event)": lambda: copier.demand(0, [40], [40]),
        "event record": lambda: torch.cuda.Event().record(),
    }
    for name, fn in steps.items():
        ts = []
        for _ in range(3 + REPS * 3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        v = statistics.median(ts[3:]) * 1e6
        out[f"host step {name} us"] = v
        print(f"host step  {name:44s} {v:8.1f} us", flush=True)


def plan_behind_copies(host, pool, H, E, dev, out: dict) -> None:
    """A grouped call over 32 resident experts issued right after a layer's demand copies (n experts on
    the copy stream) vs with the copy engine idle: does the call wait for the copies? Host return and
    kernels' end are timed from the start of the issue (copies included), in us."""
    copier = ExpertCopier(host, pool, dev)
    T, n_hit = 64, 32
    x = torch.randn((T, H), device=dev, dtype=torch.bfloat16)
    ids = (np.arange(T) % n_hit).reshape(T, 1)
    w = np.ones((T, 1), np.float32)
    lut = np.full(E, -1, np.int64)
    lut[:n_hit] = np.arange(n_hit)
    for n_copies in (0, 8, 25):
        slots = list(range(E - n_copies, E))  # copies land in slots the call does not read
        host_s, end_s = [], []
        for _ in range(REPS):
            torch.cuda.synchronize()
            s0, e0 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            s0.record()
            if n_copies:
                copier.demand(0, list(range(n_copies)), slots)
            grouped_ffn(x, pool.w13, pool.w2, plan_from_numpy(ids, w, lut, E, dev))
            host_s.append(time.perf_counter() - t0)
            e0.record()
            e0.synchronize()
            end_s.append(s0.elapsed_time(e0) / 1e3)
        torch.cuda.synchronize()
        copy_only = (
            median_seconds(
                lambda: copier.demand(0, list(range(n_copies)), slots), dev, REPS, 2, stream=copier.stream
            )
            if n_copies
            else 0.0
        )
        h, e = statistics.median(host_s), statistics.median(end_s)
        out[f"hits call after {n_copies} copies host/end/copies"] = [h * 1e6, e * 1e6, copy_only * 1e6]
        print(
            f"hits call (32 experts) after {n_copies:2d} demand copies: host returns {h * 1e6:8.1f} us, "
            f"call ends {e * 1e6:8.1f} us; the copies alone {copy_only * 1e6:8.1f} us",
            flush=True,
        )


def copy_rates(host, pool, dev, out: dict, rounds: int = 7) -> None:
    """Expert copies timed five ways, interleaved round by round: as ``dllm-profile`` times its H2D curve (one
    ``copy_`` per expert, back to back into two buffers), as the replay issues a decode layer's demand copies
    (``ExpertCopier.demand`` of 24 experts after a synchronisation) and a prefill layer's (226 experts), and the
    decode layer's 24 with one torch copy each and with one ``cudaMemcpyAsync`` each instead of the copier's
    batched issue (``runtime.cuda_copies``; on a GPU only). Per copy: the wire time in us with the rate (a difference is a copy cost the profile does not
    see), and the host's time to issue it."""
    copier = ExpertCopier(host, pool, dev)
    cuda = copier.cuda
    torch_copier = ExpertCopier(host, pool, dev, batch=False) if copier.batch is not None else None
    single_copier = None  # the same runtime, one cudaMemcpyAsync per copy
    if copier.batch is not None and copier.batch.batched:
        single_copier = ExpertCopier(host, pool, dev)
        single_copier.batch.batched = False
    E, nb = host.topo.n_experts, host.expert_bytes
    bufs = [torch.empty(nb, dtype=torch.uint8, device=dev) for _ in range(2)]
    nxt = iter(range(10**9))

    def timed(issue, n: int, stream) -> tuple[float, float]:
        """(seconds per copy of ``issue()`` (``n`` copies) on ``stream`` from a synchronised start, host seconds per
        copy to issue them)."""
        if not cuda:
            t0 = time.perf_counter()
            issue()
            dt = (time.perf_counter() - t0) / n
            return dt, dt
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        s.record(stream)
        t0 = time.perf_counter()
        issue()
        host_s = (time.perf_counter() - t0) / n
        e.record(stream)
        e.synchronize()
        return s.elapsed_time(e) / 1e3 / n, host_s

    def profile_way(n: int = 24):
        def issue():
            with torch.cuda.stream(copier.stream) if cuda else contextlib.nullcontext():
                for i in range(n):
                    bufs[i % 2].copy_(host.expert_flat(0, next(nxt) % E).view(torch.uint8), non_blocking=cuda)

        return timed(issue, n, copier.stream)

    def copier_way(n: int, cp):
        n = min(n, pool.n_slots)
        first = next(nxt) * n
        return timed(lambda: cp.demand(0, [(first + i) % E for i in range(n)], list(range(n))), n, cp.stream)

    batch = "batched issue" if copier.batch is not None else "one torch copy each"
    ways = {
        "profile's way (copy_ each, back to back)": profile_way,
        f"decode layer (demand of 24, {batch})": lambda: copier_way(24, copier),
        f"prefill layer (demand of 226, {batch})": lambda: copier_way(226, copier),
    }
    if torch_copier is not None:
        ways["decode layer (demand of 24, one torch copy each)"] = lambda: copier_way(24, torch_copier)
    if single_copier is not None:
        ways["decode layer (demand of 24, one cudaMemcpyAsync each)"] = lambda: copier_way(24, single_copier)
    for fn in ways.values():
        fn()
    samples = {k: [] for k in ways}
    for _ in range(rounds):
        for k, fn in ways.items():
            samples[k].append(fn())
    for k, v in samples.items():
        wire, issue = [w for w, _ in v], [h for _, h in v]
        m, h = statistics.median(wire), statistics.median(issue)
        out[f"copy per expert, {k}"] = m * 1e6
        out[f"copy issue per expert, {k}"] = h * 1e6
        print(
            f"copy per expert, {k:52s} {m * 1e6:8.1f} us  ({nb / m / 1e9:5.1f} GB/s; range {min(wire) * 1e6:.1f}-"
            f"{max(wire) * 1e6:.1f}); host issue {h * 1e6:6.2f} us (range {min(issue) * 1e6:.2f}-"
            f"{max(issue) * 1e6:.2f})",
            flush=True,
        )


def copy_issue_by_count(
    host, pool, dev, out: dict, counts=(1, 2, 3, 4, 6, 8, 16, 24), rounds: int = 12
) -> None:
    """The host's time to issue ``n`` expert copies as one ``cudaMemcpyBatchAsync`` and as one ``cudaMemcpyAsync``
    each (``runtime.cuda_copies``), interleaved, each from a synchronised start (on a GPU with the batch call only):
    where one way gets cheaper than the other, which ``cuda_copies.SINGLE_UP_TO`` follows."""
    cp = ExpertCopier(host, pool, dev)
    if cp.batch is None or not cp.batch.batched:
        return
    b = cp.batch
    E, nb, stream = host.topo.n_experts, host.expert_bytes, cp._stream_handle
    rng = np.random.default_rng(0)
    batched, single = copy.copy(b), copy.copy(b)
    batched.single_up_to, single.single_up_to = 0, 1 << 30  # every call one batch / one call per copy
    batched.lead_single = False
    ways = {
        "batch": lambda d, s: batched.copy(d, s, nb, stream),
        "one each": lambda d, s: single.copy(d, s, nb, stream),
    }
    for n in counts:
        n = min(n, pool.n_slots)
        t = {k: [] for k in ways}
        for r in range(rounds + 2):
            for k, way in ways.items():
                d, s = cp.addresses(0, [int(e) for e in rng.choice(E, n, replace=False)], list(range(n)))
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                way(d, s)
                if r >= 2:
                    t[k].append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        line = []
        for k, v in t.items():
            m = statistics.median(v)
            out[f"copy issue of {n} experts, {k} (us per call)"] = m * 1e6
            line.append(f"{k} {m * 1e6:7.1f} us (range {min(v) * 1e6:.1f}-{max(v) * 1e6:.1f})")
        print(f"copy issue of {n:3d} experts: " + "; ".join(line), flush=True)


def host_vs_device(pool, H, E, dev, out: dict) -> None:
    """One grouped call split into the host's part (building the plan and launching, timed on the host
    with the GPU idle) and the GPU's part (the same call with a prebuilt plan, replayed as a CUDA graph),
    next to the pipelined per-call time the profile records."""
    for n in (1, 8, 32, 64, 128):
        for tpe in (1, 2, 8):
            T = n * tpe
            x = torch.randn((T, H), device=dev, dtype=torch.bfloat16)
            ids = (np.arange(T) // tpe).reshape(T, 1)
            w = np.ones((T, 1), np.float32)
            lut = np.arange(E)

            def issue():
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                grouped_ffn(x, pool.w13, pool.w2, plan_from_numpy(ids, w, lut, E, dev))
                return time.perf_counter() - t0

            issue()
            host = statistics.median(issue() for _ in range(REPS))
            piped = median_seconds(
                lambda: grouped_ffn(x, pool.w13, pool.w2, plan_from_numpy(ids, w, lut, E, dev)),
                dev,
                REPS,
                3,
                pipelined=True,
            )
            plan = plan_from_numpy(ids, w, lut, E, dev)
            y = torch.zeros_like(x)
            try:
                g = graphed(lambda: grouped_ffn(x, pool.w13, pool.w2, plan, out=y), dev)
                device = median_seconds(g, dev, REPS, 3, pipelined=True)
            except Exception as e:  # noqa: BLE001 (a kernel that cannot be captured: say so, keep going)
                print(f"  (graph capture failed: {e})")
                device = float("nan")
            out[f"grouped n={n} tpe={tpe} host/device/pipelined"] = [host * 1e6, device * 1e6, piped * 1e6]
            print(
                f"grouped  n={n:3d} tpe={tpe}  host issue {host * 1e6:7.1f} us  device {device * 1e6:7.1f} us  "
                f"pipelined {piped * 1e6:7.1f} us",
                flush=True,
            )


def slot_pool_steps(topo, out: dict, cache: int = 40, copies: int = 25, rounds: int = 7) -> None:
    """The host's slot bookkeeping of a decode layer at ``cache`` as the replay does it: its ``copies`` demand copies
    get slots (``assign_many``), then the layer's residents become the policy's (``set_layer``: as many released), over
    ``rounds`` passes of every MoE layer. Bookkeeping only: the slots are 2-float buffers. Per layer, microseconds."""
    from dllm_offload_sim.runtime.grouped import MAX_GROUPS
    from dllm_offload_sim.runtime.slot_pool import block_layout

    L, E = topo.n_moe_layers, topo.n_experts
    homes, n = block_layout(L, cache, E, MAX_GROUPS, E)
    rng = np.random.default_rng(0)
    pool = SlotPool(n, 2, 1, dtype=torch.float32, home=homes, window=MAX_GROUPS, n_experts=E)
    for j in range(L):
        pool.set_layer(j, set(range(cache)))

    def layer(j):
        have = sorted(pool.resident(j))
        new = [int(e) for e in rng.choice(np.setdiff1d(np.arange(E), have), size=copies, replace=False)]
        keep = set(have[copies:]) | set(new)  # the policy keeps the copies and evicts as many residents
        t0 = time.perf_counter()
        pool.assign_many(j, new)
        pool.set_layer(j, keep)
        return time.perf_counter() - t0

    v = [sum(layer(j) for j in range(L)) / L for _ in range(rounds)]
    m = statistics.median(v) * 1e6
    out["slot pool us per layer"] = m
    print(
        f"slot pool  {copies} copies in, {copies} residents out of a layer at Cache {cache}: {m:7.1f} us "
        f"(range {min(v) * 1e6:.1f}-{max(v) * 1e6:.1f})",
        flush=True,
    )


def _median(fn, reps=REPS, gap_s=0.0):
    fn()
    ts = []
    for _ in range(reps):
        if gap_s:
            time.sleep(gap_s)
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def cpu_paths(topo, host, out: dict) -> None:
    H, E = topo.hidden, topo.n_experts
    T = 32
    x = torch.randn((T, H), dtype=torch.bfloat16)
    nxt = iter(range(10**9))
    pool = ThreadPoolExecutor(1)
    cpu = CpuExperts(1)
    print(
        f"torch threads: main {torch.get_num_threads()}, worker {pool.submit(torch.get_num_threads).result()}"
    )
    for n_e, tok in ((4, 1), (8, 1), (8, 2), (16, 1)):

        def jobs():
            return [
                (*host.expert(0, next(nxt) % E), torch.arange(i * tok, (i + 1) * tok) % T, torch.ones(tok))
                for i in range(n_e)
            ]

        def isolated():
            for j in jobs():
                cpu_expert_ffn(x[j[2]], j[0], j[1])

        def in_worker():
            js = jobs()
            pool.submit(cpu.run, x, js).result()

        def with_main_busy_for(seconds):
            def call():
                js = jobs()
                fut = pool.submit(cpu.run, x, js)
                t_end = time.perf_counter() + seconds
                while time.perf_counter() < t_end:  # the replay's Python between submit and the wait
                    sum(range(50))
                fut.result()

            return call

        res = {
            "isolated": _median(isolated),
            "run, main thread": _median(lambda: cpu.run(x, jobs())),
            "run, worker": _median(in_worker),
            "run, worker, 3 ms idle before": _median(in_worker, gap_s=0.003),
            "run, worker, main busy 0.3 ms": _median(with_main_busy_for(3e-4)),
        }
        sw = sys.getswitchinterval()
        sys.setswitchinterval(1e-4)
        res["run, worker, main busy 0.3 ms, switch 0.1 ms"] = _median(with_main_busy_for(3e-4))
        sys.setswitchinterval(sw)
        n0 = torch.get_num_threads()
        for th in (n0 - 2, n0 // 2, 4):
            if th >= 1:
                pool.submit(torch.set_num_threads, th).result()
                res[f"run, worker, {th} threads"] = _median(in_worker)
        pool.submit(torch.set_num_threads, n0).result()
        for name, s in res.items():
            v = s * 1e6 / n_e
            out[f"cpu {n_e}x{tok}tok {name}"] = v
            print(f"cpu {n_e:2d} experts x {tok} tok  {name:44s} {v:8.1f} us/expert", flush=True)
    pool.shutdown()
    cpu.close()


def cpu_layer_calls(topo, host, out: dict) -> None:
    """A layer's CPU experts as one ``CpuExperts.run`` from the worker thread after a 2 ms idle (as
    the profiler times them), over 1 .. 64 experts whose weights come from DRAM (different experts each
    call), with torch's default intra-op threads and fewer: does the cost per expert depend on how many
    experts a call has (the profile measures 1 and 8; KTransformers' layers have ~48), and on threads?"""
    H, E = topo.hidden, topo.n_experts
    T = 64
    nxt = iter(range(10**9))
    pool = ThreadPoolExecutor(1)
    n0 = pool.submit(torch.get_num_threads).result()
    for th in sorted({n0, max(n0 // 2, 1), min(4, n0)}, reverse=True):
        cpu = CpuExperts(1, threads=th)
        for tok in (1, 4):
            x = torch.randn((T, H), dtype=torch.bfloat16)
            for n_e in (1, 8, 32, 64):

                def call():
                    js = [
                        (
                            *host.expert(0, next(nxt) % E),
                            torch.arange(i * tok, (i + 1) * tok) % T,
                            torch.ones(tok),
                        )
                        for i in range(n_e)
                    ]
                    pool.submit(cpu.run, x, js).result()

                v = _median(call, reps=7, gap_s=0.002) * 1e6 / n_e
                out[f"cpu layer call {th} threads {n_e}x{tok}tok us/expert"] = v
                print(
                    f"cpu layer call, {th:2d} threads, {n_e:2d} experts x {tok} tok: {v:8.1f} us/expert",
                    flush=True,
                )
    pool.submit(torch.set_num_threads, n0).result()
    pool.shutdown()


def _scripted_layer():
    """A layer's CPU experts as one TorchScript function (which releases the GIL while it runs), with the
    profiling executor off (its per-shape profiling passes would otherwise run inside the timed calls)."""
    from typing import List

    import torch.nn.functional as F

    def experts_into(
        x: torch.Tensor,
        w13s: List[torch.Tensor],
        w2s: List[torch.Tensor],
        rows: List[torch.Tensor],
        gates: List[torch.Tensor],
        out: torch.Tensor,
    ) -> torch.Tensor:
        for e in range(len(w13s)):
            h = x.index_select(0, rows[e]) @ w13s[e].t()
            i = w2s[e].shape[1]
            y = (F.silu(h[:, :i]) * h[:, i:]) @ w2s[e].t()
            out.index_add_(0, rows[e], (y * gates[e].to(y.dtype).unsqueeze(1)).float())
        return out

    torch._C._jit_set_profiling_executor(False)
    return torch.jit.script(experts_into)


def cpu_next_to_copies(topo, host, dev, out: dict) -> None:
    """A decode layer's few CPU experts (4 x 1 token, from the worker thread after a 2 ms idle, as the
    profile times them) while the main thread issues 0 / 10 / 20 demand copies (as the replay does under
    OLED and clairvoyant_coop) and then waits: the CPU path the replay sees vs the profile's. Each with the
    Python executor (``CpuExperts.run``, what the runtime uses) and a TorchScript layer."""
    H, E = topo.hidden, topo.n_experts
    pool = SlotPool(32, H, topo.moe_intermediate, device=dev)
    copier = ExpertCopier(host, pool, dev)
    worker, cpu, scripted = ThreadPoolExecutor(1), CpuExperts(1), _scripted_layer()
    x = torch.randn((16, H), dtype=torch.bfloat16)
    nxt = iter(range(10**9))

    def jobs(n=4):
        return [(*host.expert(0, next(nxt) % E), torch.tensor([i]), torch.ones(1)) for i in range(n)]

    def python_run(js):
        return cpu.run(x, js)

    def script_run(js):
        w13, w2, rows, gates = (list(c) for c in zip(*js))
        return scripted(x, w13, w2, rows, gates, torch.zeros((x.shape[0], H)))

    for name, run in (("python", python_run), ("torchscript", script_run)):
        for n_copies in (0, 10, 20):

            def call():
                js = jobs()
                fut = worker.submit(run, js)
                if n_copies:
                    copier.demand(0, list(range(n_copies)), list(range(n_copies)))
                fut.result()
                torch.cuda.synchronize()

            v = _median(call, reps=15, gap_s=0.002) * 1e6 / 4
            out[f"cpu 4x1tok {name} next to {n_copies} copies us/expert"] = v
            print(
                f"cpu 4 experts x 1 tok, {name:11s}, main thread issuing {n_copies:2d} copies: {v:8.1f} us/expert",
                flush=True,
            )
    worker.shutdown()
    cpu.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--model", default="mini", help="model shape preset (mini or flash)")
    ap.add_argument("--json", help="write every number to this JSON file")
    ap.add_argument("--cpu-only", action="store_true", help="skip the GPU part (runs on any host)")
    ap.add_argument("--gpu-only", action="store_true", help="skip the CPU expert part")
    a = ap.parse_args(argv)
    topo = topology_preset(a.model)
    cuda = torch.cuda.is_available() and not a.cpu_only
    host = HostExperts(topo, n_real_layers=1, pin=cuda)
    out: dict = {"model": topo.name, "torch": torch.__version__}
    slot_pool_steps(topo, out)
    if cuda:
        out["gpu"] = torch.cuda.get_device_name(0)
        grouped_parts(topo, host, "cuda", out)
        cpu_next_to_copies(topo, host, "cuda", out)
    if not a.gpu_only:
        cpu_paths(topo, host, out)
        cpu_layer_calls(topo, host, out)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
