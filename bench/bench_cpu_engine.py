"""The CPU expert engines against the hardware's limit: one MoE layer's CPU experts, activations in and results out
on the device the runtime uses (GPU tensors on a GPU host), vs the time to stream those experts' weights.

    python bench/bench_cpu_engine.py [--model mini] [--engines kt|torch|kt-stream] [--threads N[,M...]] [--slots K]
                                     [--json FILE]

For each (experts, tokens per expert) of the grid, each engine first runs ``WARM_CALLS`` untimed calls (a new call
size allocates the native engine's pinned buffer sets, milliseconds each), then calls of ``submit`` + ``finish`` + a
device synchronisation over different experts each call (weights from DRAM), interleaved engine by engine, and prints
the median and the ratio to the bound, and the host time of ``submit`` and of ``finish`` (medians): what the
runtime's thread spends on the call (the replay's "host CPU-call issue"). ``kt`` is the native engine in its default ordering (stream), ``kt-stream``,
``kt-host`` and ``kt-direct`` the same engine (one thread pool) in the ordering named (``runtime.cpu_engine.ORDERINGS``). Several thread counts run one after
another, each with engines of its own. The bound: the experts' weight bytes at the host's streaming bandwidth (a
multi-threaded fp32 sum over 2 GiB, the best of 5, measured in the same run). ``empty call`` is a call whose
experts have no token: what the engine's path costs before and after any expert (D2H, the native task's
start and end on the stream, H2D), an upper bound of its submission-to-start latency. ``--slots K`` routes each row
to its CPU expert and K - 1 experts outside the call, which the engine masks out: the layout of the replay's calls
(a layer's tokens name its GPU experts too), where the profile's CPU curve uses one slot.

It also times the host's own Python work (a fixed loop of the kind a policy's decision and the runtime's bookkeeping
run) with the first engine's threads asleep (80 ms after its last call) and right after a call, while they may still
be busy: kt-kernel's workers spin for 50 ms after each job before they sleep, and a policy that sends experts to the
CPU in every layer keeps them spinning beside the host thread. And it times a shorter Python loop and, on a GPU, a
loop of the CUDA calls the runtime makes per layer, with the engine idle and while a 40 x 16 call computes: the
runtime's thread issues a layer's copies and grouped calls while that layer's CPU experts run.

On a GPU it also measures the contention between the CPU path and expert copies, which both read host memory:
one call of 40 experts x 16 tokens on the first engine alone, 32 expert copies (H2D) alone, and both started
together (the copies first, as the runtime issues a layer's demand copies beside its CPU call), interleaved. And, for
each engine, a cooperative layer's CPU call (8 experts x 4 tokens) alone, with 8 demand copies issued after it and
with GPU compute of about its own length issued after it (as OLED's layers run their CPU experts while the GPU copies
and computes), interleaved: its CPU path, on the GPU's clock where stream-ordered (``--engines kt-stream,kt-host``
compares the orderings).

Targets (issue: the runtime at the hardware's limits, H200 host): 16-60 experts x 1-16 tokens <= 1.25x the
bound; submission-to-start <= 50 us.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
import torch

from dllm_offload_sim.profiler.runtime_overhead import cpu_path_seconds
from dllm_offload_sim.runtime.copy_engine import ExpertCopier
from dllm_offload_sim.runtime.cpu_engine import (
    DEFAULT_ORDERING,
    default_native_threads,
    kt_kernel_variant,
    make_cpu_engine,
)
from dllm_offload_sim.runtime.host_experts import HostExperts
from dllm_offload_sim.runtime.slot_pool import SlotPool
from dllm_offload_sim.traces.topology import topology_preset
from dllm_offload_sim.traces.cli import HelpFormatter

GRID = [(16, 1), (16, 2), (16, 16), (40, 1), (40, 16), (60, 1), (60, 16)]
CONTENTION_CALL = (40, 16)  # experts x tokens of the CPU call timed beside copies
CONTENTION_COPIES = 32  # expert copies (H2D) started with it
ASLEEP_S = 0.08  # idle time after which the native engine's workers have stopped spinning (kt-kernel: 50 ms)
DURING_ITERS = 5000  # the Python loop timed while a CPU call computes (well inside a 40 x 16 call)
WARM_CALLS = 2  # untimed calls per point and engine: the native engine keeps two buffer sets per call size
BESIDE_CALL = (8, 4)  # experts x tokens of the CPU call timed beside a cooperative layer's GPU work
BESIDE_COPIES = 8  # demand copies issued after it, as the runtime issues a layer's copies after its CPU call
MATMUL_N = 4096  # square bf16 matmuls that keep the GPU busy for about the call's time


def host_work(iters: int = 40000) -> float:
    """Seconds of a fixed pure-Python loop (dict and arithmetic work, a few ms at the default ``iters``)."""
    t0 = time.perf_counter()
    acc, seen = 0, {}
    for i in range(iters):
        acc += i * i
        seen[i & 255] = acc
    return time.perf_counter() - t0


def stream_bandwidth(threads: int, gib: float = 2.0) -> float:
    """Bytes per second an fp32 sum reads with ``threads`` threads (best of 5)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    a = torch.ones(int(gib * (1 << 30)) // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - t0)
    torch.set_num_threads(before)
    return a.numel() * 4 / best


ENGINE_NAMES = (
    "kt",
    "kt-stream",
    "kt-host",
    "kt-direct",
    "torch",
)  # kt: the native engine in its default ordering


def make_engines(
    names: list[str], host: HostExperts, dev, threads: int, max_tokens: int | None = None
) -> dict:
    """One engine per name; ``kt`` and ``kt-stream`` share one kt-kernel engine (one thread pool: two would spin
    against each other), its ordering set before each call (``call``). ``max_tokens``: the engines' largest call
    (default: the grid's)."""
    most = max_tokens or max(n * t for n, t in GRID)
    engs, kt = {}, None
    for name in names:
        if name.startswith("kt"):
            kt = kt or make_cpu_engine("kt", host, dev, threads=threads, max_tokens=most)
            engs[name] = kt
        else:
            engs[name] = make_cpu_engine(name, host, dev, threads=threads, max_tokens=most)
    return engs


def routing(experts: np.ndarray, tpe: int, slots: int, n_experts: int) -> np.ndarray:
    """A call's routing, ``[tokens, slots]``: ``tpe`` rows per expert of ``experts`` in the first slot, and in each
    further slot an expert outside the call (the engine masks it out, as the replay's calls hold the layer's GPU
    experts beside their CPU ones)."""
    T = len(experts) * tpe
    first = experts[np.arange(T) // tpe].reshape(T, 1)
    if slots == 1:
        return first
    outside = np.setdiff1d(np.arange(n_experts), experts)
    pick = (np.arange(T)[:, None] * (slots - 1) + np.arange(slots - 1)[None, :]) % len(outside)
    return np.hstack([first, outside[pick]])


def bench(
    model: str,
    engines: list[str],
    threads: int,
    reps: int,
    device: str,
    host: HostExperts | None = None,
    max_tokens: int | None = None,
    host_inputs: bool = False,
    idle_s: float = 2e-3,
    slots: int = 1,
) -> dict:
    topo = topology_preset(model)
    E, H = topo.n_experts, topo.hidden
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    host = host or HostExperts(topo, n_real_layers=1, dtype=torch.bfloat16, pin=cuda)
    bw = stream_bandwidth(threads)
    engs = make_engines(engines, host, dev, threads, max_tokens)
    nxt = iter(range(10**9))

    def call(name: str, n: int, tpe: int, empty: bool = False, copier=None, during=None) -> float:
        """Seconds of one CPU call, submitted to its result in the layer's output; with ``copier``, expert
        copies are started on the copy stream just before it (the copies' own time is measured apart); with
        ``during``, that function runs between the submission and the collection (while the call computes)."""
        eng = engs[name]
        if eng.name == "kt":
            eng.ordering = name[3:] if name.startswith("kt-") else DEFAULT_ORDERING
        T = n * tpe
        experts = (next(nxt) * n + np.arange(n)) % E
        ids = routing(experts, tpe, slots, E)
        x = torch.randn((T, H), dtype=torch.bfloat16, device="cpu" if host_inputs else dev)
        out = torch.zeros((T, H), dtype=torch.float32, device=dev)
        w = np.ones(ids.shape, np.float32)
        run = [] if empty else experts.tolist()
        if cuda:
            torch.cuda.synchronize()
        if idle_s:
            time.sleep(idle_s)  # the engine idle between layers, as in the runtime
        if copier is not None:
            copies(copier)
        t0 = time.perf_counter()
        handle = eng.submit(0, x, ids, w, run)
        t_sub = time.perf_counter()
        if during is not None:
            during()
        t_fin = time.perf_counter()
        ct = eng.finish(handle, out)
        host_s[name] = (t_sub - t0, time.perf_counter() - t_fin)
        if (
            cuda
        ):  # the compute stream holds the CPU path's end and the add only (copies have their own stream)
            torch.cuda.current_stream(dev).synchronize()
        t = time.perf_counter() - t0
        if cuda:
            torch.cuda.synchronize()
        path_s[name] = cpu_path_seconds(ct, t0, t_fin)  # the CPU path alone (GPU clock where stream-ordered)
        return t

    def copies(copier) -> None:
        """Start ``CONTENTION_COPIES`` expert copies, bracketed by timing events on the copy stream."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(copier.stream)
        copier.demand(0, list(range(CONTENTION_COPIES)), list(range(CONTENTION_COPIES)))
        end.record(copier.stream)
        copy_events.append((start, end))

    def copies_alone(copier) -> float:
        torch.cuda.synchronize()
        time.sleep(2e-3)
        copies(copier)
        torch.cuda.synchronize()
        s, e = copy_events.pop()
        return s.elapsed_time(e) / 1e3

    copy_events: list = []
    host_s: dict = {}  # engine -> host seconds of its latest call's (submit, finish)
    path_s: dict = {}  # engine -> seconds of its latest call's CPU path (see call)

    def contention(name: str) -> dict:
        """The CPU call alone, the copies alone, and both together, interleaved ``reps`` times (medians)."""
        pool = SlotPool(CONTENTION_COPIES, H, topo.moe_intermediate, device=dev)
        copier = ExpertCopier(host, pool, dev)
        for e in range(CONTENTION_COPIES):
            pool.assign(0, e)
        n, tpe = CONTENTION_CALL
        alone, beside, c_alone, c_beside = [], [], [], []
        for _ in range(reps):
            alone.append(call(name, n, tpe))
            c_alone.append(copies_alone(copier))
            beside.append(call(name, n, tpe, copier=copier))
            s_, e_ = copy_events.pop()
            c_beside.append(s_.elapsed_time(e_) / 1e3)
        nbytes = CONTENTION_COPIES * host.expert_bytes
        med = statistics.median
        return {
            "engine": name,
            "experts": n,
            "tokens_per_expert": tpe,
            "copies": CONTENTION_COPIES,
            "cpu_alone_s": med(alone),
            "cpu_beside_copies_s": med(beside),
            "h2d_alone_gbps": nbytes / med(c_alone) / 1e9,
            "h2d_beside_cpu_gbps": nbytes / med(c_beside) / 1e9,
        }

    def beside_gpu_work() -> list[dict]:
        """Each engine's ``BESIDE_CALL`` alone, with ``BESIDE_COPIES`` demand copies issued after it and with GPU
        compute (bf16 matmuls lasting about the call's time) issued after it, interleaved ``reps`` times: the CPU
        path's medians (the GPU's clock for a stream-ordered call). A cooperative layer runs its CPU call while the
        GPU copies and computes; a KTransformers layer's GPU is nearly idle."""
        pool = SlotPool(BESIDE_COPIES, H, topo.moe_intermediate, device=dev)
        copier = ExpertCopier(host, pool, dev)
        n, tpe = BESIDE_CALL
        a = torch.randn((MATMUL_N, MATMUL_N), dtype=torch.bfloat16, device=dev)
        c = torch.empty_like(a)
        s0, s1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        one = []
        for _ in range(5):
            s0.record()
            torch.mm(a, a, out=c)
            s1.record()
            s1.synchronize()
            one.append(s0.elapsed_time(s1) / 1e3)
        mm_s = statistics.median(one)
        med = statistics.median
        out = []
        for name in engs:
            for _ in range(WARM_CALLS):
                call(name, n, tpe)
            alone_s = med([(call(name, n, tpe), path_s[name])[1] for _ in range(3)])
            k = max(1, round(alone_s / mm_s))
            ways = {
                "alone": None,
                "copies": lambda: copier.demand(0, list(range(BESIDE_COPIES)), list(range(BESIDE_COPIES))),
                "compute": lambda: [torch.mm(a, a, out=c) for _ in range(k)],
            }
            t = {w: [] for w in ways}
            for _ in range(reps):
                for w, during in ways.items():
                    call(name, n, tpe, during=during)
                    t[w].append(path_s[name])
            out.append(
                {
                    "engine": name,
                    "experts": n,
                    "tokens_per_expert": tpe,
                    "copies": BESIDE_COPIES,
                    "matmuls": k,
                    "matmul_s": mm_s,
                    **{f"path_{w}_s": med(v) for w, v in t.items()},
                    **{f"path_{w}_range_s": [min(v), max(v)] for w, v in t.items()},
                }
            )
        return out

    def api_work() -> float:
        """Seconds of a fixed loop of the CUDA calls the runtime makes per layer (an event recorded and waited on,
        a tiny kernel launched), 50 times; NaN off a GPU."""
        if not cuda:
            return float("nan")
        side, z = torch.cuda.Stream(device=dev), torch.zeros(8, device=dev)
        t0 = time.perf_counter()
        for _ in range(50):
            ev = torch.cuda.Event()
            ev.record()
            side.wait_event(ev)
            z.add_(1.0)
        return time.perf_counter() - t0

    def host_work_beside(name: str) -> dict:
        """The host's Python loop with the engine's threads asleep and right after a call, and a shorter loop
        and the CUDA-call loop with the engine idle and while a call computes, interleaved (medians)."""
        asleep, after, idle_loop, during_s, idle_api, during_api = [], [], [], [], [], []

        def beside_call():
            during_s.append(host_work(DURING_ITERS))
            during_api.append(api_work())

        for _ in range(reps):
            time.sleep(ASLEEP_S)
            asleep.append(host_work())
            call(name, 8, 1)
            after.append(host_work())
            time.sleep(idle_s or 2e-3)  # the engine idle, as between a replay's layers
            idle_loop.append(host_work(DURING_ITERS))
            idle_api.append(api_work())
            call(name, *CONTENTION_CALL, during=beside_call)
        med = statistics.median
        return {
            "engine": name,
            "asleep_s": med(asleep),
            "after_call_s": med(after),
            "idle_short_s": med(idle_loop),
            "during_call_s": med(during_s),
            "idle_api_s": med(idle_api),
            "during_call_api_s": med(during_api),
        }

    r = {
        "model": topo.name,
        "device": str(dev),
        "threads": threads,
        "stream_gbps": bw / 1e9,
        "max_tokens": max_tokens or max(n * t for n, t in GRID),
        "host_inputs": host_inputs,
        "idle_s": idle_s,
        "slots": slots,
        "kt_variant": kt_kernel_variant(),
        "torch": torch.__version__,
        "points": [],
    }
    try:
        for n, tpe in [(1, 1)] + GRID:
            times = {name: [] for name in engs}
            hosts = {name: [] for name in engs}
            for _ in range(
                WARM_CALLS
            ):  # a new call size allocates its pinned buffer sets (milliseconds): untimed
                for name in engs:
                    call(name, n, tpe, empty=(n, tpe) == (1, 1))
            for _ in range(reps):  # engines interleaved: the shared host's speed moves between runs
                for name in engs:
                    times[name].append(call(name, n, tpe, empty=(n, tpe) == (1, 1)))
                    hosts[name].append(host_s[name])
            bound = n * host.expert_bytes / bw
            for name in engs:
                med = statistics.median(times[name])
                r["points"].append(
                    {
                        "engine": name,
                        "experts": n,
                        "tokens_per_expert": tpe,
                        "empty": (n, tpe) == (1, 1),
                        "median_s": med,
                        "min_s": min(times[name]),
                        "max_s": max(times[name]),
                        "bound_s": bound,
                        "ratio": med / bound,
                        "submit_host_s": statistics.median(h[0] for h in hosts[name]),
                        "finish_host_s": statistics.median(h[1] for h in hosts[name]),
                    }
                )
        r["host_work"] = host_work_beside(next(iter(engs)))
        if cuda:
            r["contention"] = contention(next(iter(engs)))
            r["beside_gpu_work"] = beside_gpu_work()
    finally:
        for eng in {id(e): e for e in engs.values()}.values():
            eng.close()
    return r


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python bench/bench_cpu_engine.py",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    p.add_argument("--model", default="mini", help="model shape (default mini)")
    p.add_argument(
        "--engines",
        default=None,
        help="comma-separated engines: kt (the native engine, stream-ordered), "
        "kt-stream, kt-host, kt-direct (that ordering), torch (default: kt where installed, else torch; interleaving kt with torch slows "
        "kt, as the reference's OpenMP threads keep spinning)",
    )
    p.add_argument(
        "--threads",
        default=None,
        help="engine threads, or a comma-separated list run one after another "
        "(default: the native engine's, every core but two)",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="the engines' largest call (default: the grid's "
        "largest; dllm-profile's engine takes up to 2048)",
    )
    p.add_argument(
        "--host-inputs",
        action="store_true",
        help="activations start on the host (default: on the "
        "device, as the replay and dllm-profile have them); on the H200 host kt-kernel's calls then took up "
        "to 11x longer",
    )
    p.add_argument("--reps", type=int, default=15, help="calls per point and engine (default 15)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--idle-ms",
        type=float,
        default=2.0,
        help="idle spell before each timed call, as the engine waits "
        "between layers (default 2; 0: calls back to back)",
    )
    p.add_argument(
        "--slots",
        type=int,
        default=1,
        help="routing slots per token (default 1: each row routed to its "
        "CPU expert only); up to the model's top-k, the others naming experts outside the call, which the "
        "engine masks out as in the replay's calls (--slots 8 on mini: the replay's layout)",
    )
    p.add_argument("--json", default=None, help="also write the numbers to this file")
    a = p.parse_args(argv)
    if a.idle_ms < 0:
        print(f"error: --idle-ms must be >= 0, got {a.idle_ms}", file=sys.stderr)
        return 2
    top_k = topology_preset(a.model).top_k
    if not 1 <= a.slots <= top_k:
        print(f"error: --slots must be in 1..{top_k} (the model's top-k), got {a.slots}", file=sys.stderr)
        return 2
    engines = [e for e in (a.engines or ("kt" if kt_kernel_variant() else "torch")).split(",") if e]
    bad = [e for e in engines if e not in ENGINE_NAMES]
    if bad or not engines:
        print(
            f"error: --engines: expected some of {', '.join(ENGINE_NAMES)}, got {a.engines!r}",
            file=sys.stderr,
        )
        return 2
    if any(e.startswith("kt") for e in engines) and kt_kernel_variant() is None:
        print(
            "error: --engines kt needs kt-kernel: pip install --no-deps kt-kernel==0.7.2 (and gguf)",
            file=sys.stderr,
        )
        return 2
    try:
        counts = [int(t) for t in a.threads.split(",")] if a.threads else [default_native_threads()]
    except ValueError:
        counts = [0]
    if any(t < 1 for t in counts):
        print(f"error: --threads: expected positive integers, got {a.threads!r}", file=sys.stderr)
        return 2
    if a.max_tokens is not None and a.max_tokens < max(n * t for n, t in GRID):
        print(
            f"error: --max-tokens must cover the grid's largest call ({max(n * t for n, t in GRID)}), got "
            f"{a.max_tokens}",
            file=sys.stderr,
        )
        return 2
    runs = []
    for threads in counts:
        r = bench(
            a.model,
            engines,
            threads,
            a.reps,
            a.device,
            max_tokens=a.max_tokens,
            host_inputs=a.host_inputs,
            idle_s=a.idle_ms / 1e3,
            slots=a.slots,
        )
        report(r)
        runs.append(r)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(runs if len(runs) > 1 else runs[0], f, indent=2)
    return 0


def report(r: dict) -> None:
    threads = r["threads"]
    print(
        f"[{r['model']} on {r['device']}, {threads} threads, kt-kernel {r['kt_variant']}, host streams "
        f"{r['stream_gbps']:.1f} GB/s, engines sized for {r['max_tokens']} tokens, activations on the "
        f"{'host' if r['host_inputs'] else 'device'}, {r.get('idle_s', 2e-3) * 1e3:g} ms idle before each call, "
        f"{r.get('slots', 1)} routing slot(s) per token]"
    )
    print(
        f"{'engine':>9} {'experts x tokens':>17} {'median ms':>10} {'range ms':>15} {'bound ms':>9} {'/ bound':>8} "
        f"{'host submit us':>15} {'host finish us':>15}"
    )
    for q in r["points"]:
        shape = "empty call" if q["empty"] else f"{q['experts']} x {q['tokens_per_expert']}"
        ratio = "" if q["empty"] else f"{q['ratio']:.2f}x"
        print(
            f"{q['engine']:>9} {shape:>17} {q['median_s'] * 1e3:>10.3f} "
            f"{q['min_s'] * 1e3:>7.3f}-{q['max_s'] * 1e3:<7.3f} {q['bound_s'] * 1e3:>9.3f} {ratio:>8} "
            f"{q.get('submit_host_s', 0) * 1e6:>15.1f} {q.get('finish_host_s', 0) * 1e6:>15.1f}"
        )
    print(
        "targets (H200 host): 16-60 experts x 1-16 tokens <= 1.25x the bound; empty call (submission-to-start "
        "bound) <= 0.05 ms"
    )
    h = r["host_work"]
    print(
        f"host Python work ({h['engine']}): {h['asleep_s'] * 1e3:.2f} ms with the engine's threads asleep, "
        f"{h['after_call_s'] * 1e3:.2f} ms right after a call ({h['after_call_s'] / h['asleep_s']:.2f}x)"
    )
    if "during_call_s" in h:
        n, tpe = CONTENTION_CALL
        api = ""
        if h["idle_api_s"] == h["idle_api_s"]:
            api = (
                f"; 50 event records, waits and tiny launches {h['idle_api_s'] * 1e6:.0f} us idle, "
                f"{h['during_call_api_s'] * 1e6:.0f} us during ({h['during_call_api_s'] / h['idle_api_s']:.2f}x)"
            )
        print(
            f"host work while a {n} x {tpe} call computes: Python loop {h['idle_short_s'] * 1e6:.0f} us idle, "
            f"{h['during_call_s'] * 1e6:.0f} us during ({h['during_call_s'] / h['idle_short_s']:.2f}x){api}"
        )
    c = r.get("contention")
    if c:
        print(
            f"contention ({c['engine']}, {c['experts']} x {c['tokens_per_expert']} beside {c['copies']} expert copies): "
            f"CPU call {c['cpu_alone_s'] * 1e3:.3f} ms alone, {c['cpu_beside_copies_s'] * 1e3:.3f} ms beside the copies "
            f"({c['cpu_beside_copies_s'] / c['cpu_alone_s']:.2f}x); H2D {c['h2d_alone_gbps']:.1f} GB/s alone, "
            f"{c['h2d_beside_cpu_gbps']:.1f} GB/s beside the CPU call"
        )
    for b in r.get("beside_gpu_work", []):
        extra = lambda w: (b[f"path_{w}_s"] - b["path_alone_s"]) * 1e6  # noqa: E731
        rng = lambda w: "-".join(f"{v * 1e3:.3f}" for v in b[f"path_{w}_range_s"])  # noqa: E731
        print(
            f"beside the layer's GPU work ({b['engine']}, {b['experts']} x {b['tokens_per_expert']}): CPU path "
            f"{b['path_alone_s'] * 1e3:.3f} ms alone ({rng('alone')}), {b['path_copies_s'] * 1e3:.3f} ms with "
            f"{b['copies']} copies after it ({rng('copies')}; {extra('copies'):+.0f} us), "
            f"{b['path_compute_s'] * 1e3:.3f} ms with {b['matmuls']} GPU matmuls after it ({rng('compute')}; "
            f"{extra('compute'):+.0f} us)"
        )


if __name__ == "__main__":
    sys.exit(main())
