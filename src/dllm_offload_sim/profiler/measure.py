"""Measure every curve of a hardware profile with the runtime's own primitives (validate/).

Each point is the median over ``reps`` timed calls after warm-up (CUDA events on a GPU).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
import platform
import re
import subprocess

import numpy as np
import torch

from dllm_offload_sim.costmodel.cost_model import CostModel
from dllm_offload_sim.profiler.host_probe import (
    CPU_IDLE_S,
    CPU_PROBE_CALL,
    StealMeter,
    cpu_engine_probe_seconds,
    SETTLE_TOL,
    settle_engine,
    engine_call,
    host_probe,
    memory_bandwidth_gbps,
)
from dllm_offload_sim.costmodel.profile import DEFAULT_CPU_ORDERING, HardwareProfile
from dllm_offload_sim.profiler.cpu_fit import CPU_OVERHEAD_MAX_TOKENS, cpu_band_fit, cpu_expert_fit
from dllm_offload_sim.profiler.runtime_overhead import (
    CONTENTION_EXPERTS,
    beside_engine_terms,
    bookkeeping_seconds,
    copy_contention_slowdowns,
    cpu_busy_gpu_seconds,
    cpu_call_seconds,
    cpu_issue_seconds,
    cut_probes,
    grouped_issue_seconds,
    policy_time_factor,
    prefetch_start_seconds,
    residual_split,
    routing_sync_seconds,
    whole_stack_probe,
)
from dllm_offload_sim.runtime.timing import (
    graphed,
    host_launch_seconds,
    interleaved_medians,
    median_seconds,
    median_seconds_after_idle,
)
from dllm_offload_sim.traces.topology import ModelTopology
from dllm_offload_sim.runtime.copy_engine import COPIES_PER_EXPERT
from dllm_offload_sim.runtime.cpu_engine import make_cpu_engine
from dllm_offload_sim.runtime.grouped import MAX_GROUPS
from dllm_offload_sim.runtime.grouped_graph import GroupedGraph
from dllm_offload_sim.runtime.host_experts import HostExperts
from dllm_offload_sim.runtime.layer import LmHead, NonExpertLayer
from dllm_offload_sim.runtime.slot_pool import SlotPool

MIB = 1 << 20
# experts per timed CPU call (a decode layer's CPU experts under OLED at Cache 40: ~7)
CPU_EXPERTS_PER_CALL = 8
# tokens of the largest timed CPU call (fewer experts per call at many tokens each)
CPU_CALL_MAX_TOKENS = 2048
CPU_CURVE_TRIES = 3  # measurements of a CPU-curve point before a stalled one fails the profile
H2D_RETRIES = 2  # measurements of the H2D curve again where its largest copy took no longer than its smallest
CPU_STALL_RATIO, CPU_STALL_MIN_S = (
    3.0,
    1e-3,
)  # a stalled call: this many times the many-expert call's, and this long
# the fixed cost of a CPU call is read at decode-sized calls (this many tokens or fewer)
CPU_BAND_EXPERTS = (
    32,
    128,
)  # larger timed CPU calls: the cost of each expert beyond 8, then beyond 32 (bands)


class CpuCurveError(RuntimeError):
    """The CPU expert curve measured stalled calls (a call over more experts no slower than over one, both several
    times the curve's fastest call), even after re-measuring: the profile would predict CPU paths wrongly, so none
    is written."""


def cpu_call_experts(tokens: int) -> int:
    """Experts of the many-expert timed CPU call at ``tokens`` tokens each: ``CPU_EXPERTS_PER_CALL``, fewer (at
    least 2) where that call would exceed ``CPU_CALL_MAX_TOKENS`` tokens."""
    return max(2, min(CPU_EXPERTS_PER_CALL, CPU_CALL_MAX_TOKENS // max(int(tokens), 1)))


def cpu_band_experts(tokens: int, experts: int) -> int:
    """Experts of a band's timed CPU call at ``tokens`` tokens each: ``experts``, fewer (at least 2) where that call
    would exceed ``CPU_CALL_MAX_TOKENS`` tokens."""
    return max(2, min(int(experts), CPU_CALL_MAX_TOKENS // max(int(tokens), 1)))


def cpu_engine_max_tokens(tokens: list[int], bands=()) -> int:
    """The largest CPU call the curve at ``tokens`` (and its ``bands``' calls) times: the engine's ``max_tokens`` when
    profiling."""
    return max(n * max([cpu_call_experts(n), *(cpu_band_experts(n, k) for k in bands)]) for n in tokens)


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _driver() -> str:
    try:
        return (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout.strip()
            or "unknown"
        )
    except (OSError, subprocess.SubprocessError):
        return "n/a"


def gpu_slug(device_name: str) -> str:
    """The GPU's short name as shipped profiles spell it: lower case, the vendor and brand words dropped, the words
    up to the first one with a digit joined ('NVIDIA H100 80GB HBM3' -> 'h100', 'NVIDIA GeForce RTX 5090' ->
    'rtx5090', 'NVIDIA RTX PRO 6000 Blackwell Server Edition' -> 'rtxpro6000')."""
    words = [
        w for w in re.split(r"[\s_-]+", device_name.lower()) if w and w not in ("nvidia", "geforce", "tesla")
    ]
    kept = []
    for w in words:
        kept.append(w)
        if any(c.isdigit() for c in w):
            break
    return "".join(kept) or "gpu"


def default_profile_name(device_name: str | None, model_name: str) -> str:
    """``<gpu>-<model>`` (``cpu-<model>`` without a GPU), e.g. ``h100-mini`` for ``llada2-mini`` on an H100."""
    return f"{gpu_slug(device_name) if device_name else 'cpu'}-{model_name.split('-')[-1]}"


def stamp(device, dtype) -> dict:
    cuda = torch.device(device).type == "cuda"
    return {
        "gpu": torch.cuda.get_device_name(device) if cuda else "none (CPU)",
        "driver": _driver() if cuda else "n/a",
        "cuda": torch.version.cuda or "n/a",
        "torch": torch.__version__,
        "cpu_model": _cpu_model(),
        "cpu_threads": torch.get_num_threads(),
        "dtype": str(dtype).replace("torch.", ""),
        "host": platform.node(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


class Grids:
    """The points measured (``quick`` shrinks them for tests on a CPU)."""

    def __init__(self, quick: bool = False):
        if quick:
            self.h2d_mib = [
                1,
                8,
                64,
            ]  # spread wide: a busy 2-core host must still show copy time growing with bytes
            self.experts, self.tpe = [1, 4], [1, 4]
            self.tokens = [1, 4, 16]
            self.cpu_bands = (12,)
            self.ne_tokens, self.kv = [1, 16], [0, 64]
            self.reps, self.warmup, self.passes = 5, 1, 3  # medians that survive a busy 2-core CI host
        else:
            self.h2d_mib = [1, 2, 4, 6, 8, 16, 24, 32, 64]
            self.experts = [1, 2, 4, 8, 16, 32, 64, 128, 256]
            self.tpe = [1, 2, 4, 8, 16, 32, 64, 128]
            # 20-28: a prefill call's heaviest experts carry 17-31 tokens, where every measured profile's curve fell
            # from 16 to 32 tokens (kt-kernel may change kernels there); points between show where
            self.tokens = [1, 2, 4, 8, 16, 20, 24, 28, 32, 64, 128, 256, 512, 1024]
            self.cpu_bands = CPU_BAND_EXPERTS
            self.ne_tokens, self.kv = [1, 16, 64, 256, 1024], [0, 256, 1024, 4096]
            self.reps, self.warmup, self.passes = (
                20,
                3,
                5,
            )  # passes: round-robin passes over a host-bound curve


@dataclass(frozen=True)
class CpuCurve:
    """The CPU expert curve as :func:`measure_cpu_expert` measured it: seconds per expert at each point, the fixed cost
    of a call, the engine's threads, the bands (``cpu_expert.bands``: the cost of each expert beyond ``after`` in a
    larger call), and the timed calls behind them (a 1-expert and an ``many_experts``-expert call at each point, and
    the larger calls of ``band_experts``, seconds), which the profile keeps for diagnosis."""

    per_expert_s: list
    call_overhead_s: float
    threads: int
    one_expert_s: list
    many_experts: list
    many_s: list
    bands: list = field(default_factory=list)
    band_experts: list = field(default_factory=list)
    band_s: list = field(default_factory=list)


def measure_cpu_expert(
    topo: ModelTopology, engine, gr: Grids, dtype=torch.bfloat16, progress=None, dispatch: list | None = None
) -> CpuCurve:
    """The CPU expert curve as the replay runs CPU experts (:class:`CpuCurve`).

    A layer's CPU experts go through the CPU ``engine`` as the replay calls it (``submit`` then ``finish``,
    and on a GPU a synchronisation: the call's whole path) after an idle spell (the engine waits while the
    GPU runs the rest of the layer). The activations start where the replay has them, on the engine's device,
    so a call includes their trip to the host and the result's trip back; ``dispatch`` (seconds of that round
    trip at each of ``gr.tokens``, :func:`measure_cpu_dispatch`), which the cost model charges apart, is taken
    out of the fixed cost. (On the H200 host, kt-kernel calls handed activations already on the host took up
    to 11x longer than the same calls handed device activations, a condition the replay never meets.)
    Calls over 1 and over ``m = cpu_call_experts(n)`` experts separate the cost per expert from the fixed
    cost of a call, which is read at the points of at most ``CPU_OVERHEAD_MAX_TOKENS`` tokens (the decode-sized
    calls): with many tokens a 1-expert call leaves a parallel engine's threads idle (kt-kernel at 64 and 128
    tokens on the H200 host: 1 expert 1.97 and 3.36 ms, 8 experts 1.78 and 2.66 ms), so its excess over the cost per
    expert is not a fixed cost, and past those points an expert costs at least the ``m``-expert call's average
    (:func:`cpu_expert_fit`). A point whose ``m``-expert call is no slower than its 1-expert call is measured
    again (up to ``CPU_CURVE_TRIES`` times). If it stays so, it is kept, unless its 1-expert call is a
    stall (at least ``CPU_STALL_RATIO`` times the ``m``-expert call and ``CPU_STALL_MIN_S`` long): then
    :class:`CpuCurveError` names the points and their times. (For the reference engine, an isolated expert FFN
    timed back-to-back on the main thread is ~2x faster and under-predicts the replay's CPU path ~3x.)"""
    E, H = topo.n_experts, topo.hidden
    nxt = iter(range(10**9))
    threads = engine.threads or torch.get_num_threads()
    cpu_call = lambda n_experts, n: engine_call(engine, E, H, n_experts, n, dtype, nxt)  # noqa: E731
    t_cpu = lambda fn: median_seconds_after_idle(fn, gr.reps, gr.warmup, CPU_IDLE_S)  # noqa: E731
    many_n = [cpu_call_experts(n) for n in gr.tokens]
    todo, one, many = list(range(len(gr.tokens))), [0.0] * len(gr.tokens), [0.0] * len(gr.tokens)
    for attempt in range(CPU_CURVE_TRIES):
        calls = [cpu_call(1, gr.tokens[i]) for i in todo] + [cpu_call(many_n[i], gr.tokens[i]) for i in todo]
        both = interleaved_medians(calls, t_cpu, gr.passes)
        for i, a, b in zip(todo, both[: len(todo)], both[len(todo) :]):
            one[i], many[i] = a, b
        todo = [i for i in todo if not many[i] > one[i]]
        if not todo:
            break
        if progress is not None and attempt + 1 < CPU_CURVE_TRIES:
            progress(
                f"cpu_expert again at tokens {[gr.tokens[i] for i in todo]} (a call over more experts was no "
                f"slower than over one)"
            )
    stalled = [i for i in todo if one[i] >= max(CPU_STALL_RATIO * many[i], CPU_STALL_MIN_S)]
    if stalled:
        pts = "; ".join(
            f"{gr.tokens[i]} tokens: 1 expert {one[i] * 1e3:.3f} ms, {many_n[i]} experts "
            f"{many[i] * 1e3:.3f} ms"
            for i in stalled
        )
        raise CpuCurveError(
            f"cpu_expert ({engine.name} engine, {threads} threads): after {CPU_CURVE_TRIES} "
            f"measurements a call over more experts is still no slower than over one ({pts}); the "
            f"host or the engine stalls calls of some sizes. No profile written: run "
            f"`python bench/bench_cpu_engine.py` to see the engine's calls alone."
        )
    per_expert, overhead = cpu_expert_fit(gr.tokens, one, many, many_n, dispatch)
    bands, band_n, band_s = _cpu_bands(gr, E, cpu_call, t_cpu, many_n, many, per_expert)
    return CpuCurve(
        per_expert, overhead, int(threads), list(one), list(many_n), list(many), bands, band_n, band_s
    )


def _cpu_bands(
    gr: Grids, n_experts: int, cpu_call, t_cpu, many_n: list, many: list, per_expert: list
) -> tuple[list, list, list]:
    """The cost of each expert beyond the ``many_n``-expert call in larger calls (``gr.cpu_bands`` experts, fewer
    where a call would exceed ``CPU_CALL_MAX_TOKENS`` tokens or the model's ``n_experts``): ``cpu_expert.bands`` as
    ``[{"after", "seconds"}]``, the experts of each call ``[band][point]`` and its seconds (0 where not timed). A band's
    cost at a point is the slope from the previous call's time to its own; where the call cannot be larger than the
    previous one (many tokens, few experts), it is not timed and the band keeps the previous band's cost."""
    if not gr.cpu_bands:
        return [], [], []
    band_n = [[min(cpu_band_experts(t, k), n_experts) for t in gr.tokens] for k in gr.cpu_bands]
    before = [list(many_n)] + band_n[:-1]
    todo = [(b, i) for b in range(len(band_n)) for i in range(len(gr.tokens)) if band_n[b][i] > before[b][i]]
    timed = (
        interleaved_medians([cpu_call(band_n[b][i], gr.tokens[i]) for b, i in todo], t_cpu, gr.passes)
        if todo
        else []
    )
    band_s = [[0.0] * len(gr.tokens) for _ in band_n]
    for (b, i), v in zip(todo, timed):
        band_s[b][i] = v
    after = [int(max(many_n))] + [int(k) for k in gr.cpu_bands[:-1]]
    return cpu_band_fit(after, band_n, band_s, many_n, many, per_expert), band_n, band_s


def measure_cpu_dispatch(topo: ModelTopology, dev: torch.device, gr: Grids, dtype=torch.bfloat16) -> list:
    """Seconds to bring a layer's activations (``gr.tokens`` rows) to the host and results back (fp32),
    synchronised, as the replay's CPU path does around its CPU experts."""
    cuda = dev.type == "cuda"
    H = topo.hidden
    t_sync = lambda fn: median_seconds(fn, dev, gr.reps, gr.warmup)  # noqa: E731  (it synchronises anyway)

    def roundtrip_call(n):
        xd = torch.randn((n, H), device=dev, dtype=dtype)
        back = torch.empty((n, H), dtype=torch.float32, pin_memory=cuda)

        def roundtrip():
            xh = xd.to("cpu", non_blocking=False)
            r = back.to(dev, non_blocking=cuda)
            if cuda:
                torch.cuda.current_stream().synchronize()
            return xh, r

        return roundtrip

    return interleaved_medians([roundtrip_call(n) for n in gr.tokens], t_sync, gr.passes)


def measure_profile(
    topo: ModelTopology,
    device="cuda",
    dtype=torch.bfloat16,
    quick: bool = False,
    name: str = "",
    progress=print,
    cpu_threads: int | None = None,
    cpu_engine: str = "auto",
    cpu_ordering: str = DEFAULT_CPU_ORDERING,
) -> HardwareProfile:
    """Measure ``topo``'s curves on ``device`` and return the profile (status ``measured``).

    ``cpu_engine``: the CPU expert engine to measure (``runtime.cpu_engine``: ``auto``, ``torch`` or ``kt``);
    ``cpu_threads``: its threads (default: the engine's); ``cpu_ordering``: how the native engine's calls are
    ordered with the GPU (``runtime.cpu_engine.ORDERINGS``). All are recorded in the profile, and the replay runs
    its CPU experts on the same engine, threads and ordering."""
    gr = Grids(quick)
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    E, H, I = topo.n_experts, topo.hidden, topo.moe_intermediate
    # GPU work is timed pipelined (back-to-back calls), as the runtime issues it
    t = lambda fn, stream=None: median_seconds(fn, device, gr.reps, gr.warmup, stream, pipelined=True)  # noqa: E731
    host = HostExperts(topo, n_real_layers=1, dtype=dtype, pin=cuda)
    steal = StealMeter()
    probe_before = host_probe(host)

    # H2D on a dedicated copy stream, as the runtime copies experts: each copy reads another place of the experts'
    # pinned memory (rereading one buffer times a faster copy than the runtime's expert copies get)
    progress("h2d")
    stream = torch.cuda.Stream(device=dev) if cuda else None
    h2d_b = [mib * MIB for mib in gr.h2d_mib]
    host_bytes, step = host.flat.view(-1).view(torch.uint8), host.expert_bytes
    if host_bytes.numel() < 4 * max(
        h2d_b
    ):  # experts smaller than the copies (tiny test models): a buffer of its own
        host_bytes, step = torch.empty(4 * max(h2d_b), dtype=torch.uint8, pin_memory=cuda), max(h2d_b)

    def copy_call(n):
        dsts = [torch.empty(n, dtype=torch.uint8, device=dev) for _ in range(2)]
        starts = range(0, host_bytes.numel() - n + 1, step)  # from one expert's place to the next's
        k = iter(range(10**9))

        def cp():
            i = next(k)
            src, dst = host_bytes[starts[i % len(starts)] :][:n], dsts[i % 2]
            if cuda:
                with torch.cuda.stream(stream):
                    dst.copy_(src, non_blocking=True)
            else:
                dst.copy_(src)

        return cp

    t_copy = lambda fn: median_seconds(fn, device, gr.reps, gr.warmup, stream, pipelined=True, rounds=1)  # noqa: E731
    h2d_s = interleaved_medians([copy_call(n) for n in h2d_b], t_copy, gr.passes)
    for _ in range(
        H2D_RETRIES
    ):  # a slow spell over the smallest copies: the curve did not grow with the bytes
        if h2d_s[-1] > h2d_s[0]:
            break
        progress("h2d again: the largest copy took no longer than the smallest (a busy host)")
        h2d_s = interleaved_medians([copy_call(n) for n in h2d_b], t_copy, gr.passes)

    # the host's speed at issuing GPU work, stamped so that a validation run can compare its own
    launch_s = host_launch_seconds(dev)

    # grouped GPU expert calls as the replay makes them (runtime.grouped_graph): the routing and slot
    # table uploaded in one copy, then one captured graph over a block of MAX_GROUPS slots
    progress("gpu_experts")
    pool = SlotPool(MAX_GROUPS, H, I, dtype=dtype, device=dev)
    for s in range(MAX_GROUPS):
        pool.flat[s].copy_(host.expert_flat(0, s % E))

    def grouped_call(n, tpe):
        """(upload + replay, replay alone) of a call over n experts x tpe tokens (each token routed to one)."""
        T = n * tpe
        x = torch.randn((T, H), device=dev, dtype=dtype)
        gg = GroupedGraph(
            x,
            torch.zeros((T + 1, H), device=dev, dtype=dtype),
            1,
            max(n, E),
            (0, MAX_GROUPS),
            pool.w13,
            pool.w2,
        )
        ids = (np.arange(T) // tpe).reshape(T, 1)
        w = np.ones((T, 1), np.float32)
        lut = np.arange(max(n, E), dtype=np.int64) % MAX_GROUPS
        gg.upload(ids, w, lut)
        return (lambda: gg.run(ids, w, lut)), gg.replay

    calls = [grouped_call(n, tpe) for n in gr.experts for tpe in gr.tpe]
    # each call issued with the GPU idle (the runtime's first call of a layer follows the wait for the
    # gate's routing): host work (pack, upload, replay) + kernels. Host-bound points drift with the
    # shared host's load: the grid is measured round-robin.
    t1 = lambda fn: median_seconds(fn, device, gr.reps, gr.warmup)  # noqa: E731

    def grid(flat):  # one row per expert count, one column per tokens-per-expert
        return [flat[i * len(gr.tpe) : (i + 1) * len(gr.tpe)] for i in range(len(gr.experts))]

    gpu = grid(interleaved_medians([c for c, _ in calls], t1, gr.passes))
    # the kernels alone: the same graphs replayed back to back on uploaded inputs
    progress("gpu_experts_device")
    gpu_dev = grid([t(r) for _, r in calls])
    del calls

    progress("cpu_dispatch")
    disp = measure_cpu_dispatch(topo, dev, gr, dtype)
    progress("cpu_expert")
    cpu_meter = StealMeter()
    engine = make_cpu_engine(
        cpu_engine,
        host,
        dev,
        threads=cpu_threads,
        max_tokens=cpu_engine_max_tokens(gr.tokens, gr.cpu_bands),
        ordering=cpu_ordering,
    )
    # the host's bandwidth and the engine's probe call just before and after the curve: a shared VM's moves
    cpu_gbps = [memory_bandwidth_gbps()]
    try:
        settle = settle_engine(engine, topo.n_experts, topo.hidden, dtype)
        cpu_probe = [cpu_engine_probe_seconds(engine, topo.n_experts, topo.hidden, dtype)]
        cpu = measure_cpu_expert(topo, engine, gr, dtype, progress=progress, dispatch=disp)
        cpu_probe.append(cpu_engine_probe_seconds(engine, topo.n_experts, topo.hidden, dtype))
    finally:
        engine.close()
    cpu_gbps.append(memory_bandwidth_gbps())
    cpu_steal = cpu_meter.fraction()

    # non-expert part of a MoE layer, and a dense layer, vs (tokens, kv length)
    progress("non_expert")
    moe_layer = NonExpertLayer(topo, device=dev, dtype=dtype)
    dense_layer = NonExpertLayer(topo, device=dev, dtype=dtype, dense=True)
    kv_max = max(gr.kv) + max(gr.ne_tokens)
    cache = moe_layer.new_cache(kv_max)
    ne, dn, sync = [], [], []
    for n in gr.ne_tokens:  # replayed as CUDA graphs on a GPU, one per (tokens, kv length)
        x = torch.randn((n, H), device=dev, dtype=dtype)
        gs = [graphed(lambda: moe_layer(x, cache, kv), dev) for kv in gr.kv]
        ne.append([t(g) for g in gs])
        dn.append([t(graphed(lambda: dense_layer(x, cache, kv), dev)) for kv in gr.kv])
        if n <= 16:  # decode-sized layers: the host waits for each one's routing (runtime.routing_sync_s)
            sync += [routing_sync_seconds(g, s, dev, gr.reps, gr.warmup) for g, s in zip(gs, ne[-1])]

    progress("per_forward")
    head = LmHead(topo, device=dev, dtype=dtype)
    fwd = []
    for n in gr.tokens:
        x = torch.randn((n, H), device=dev, dtype=dtype)
        fwd.append(t(graphed(lambda: head(x), dev)))

    backend = (
        "grouped_mm in a CUDA graph" if cuda and hasattr(torch, "_grouped_mm") else "eager per-group loop"
    )
    prof = HardwareProfile(
        name=name or default_profile_name(torch.cuda.get_device_name(device) if cuda else None, topo.name),
        status="measured",
        stamp={
            **stamp(device, dtype),
            "host_launch_us": round(launch_s * 1e6, 3),
            "host_probe": {
                "before": probe_before,
                "after": host_probe(host),
                "steal_frac": steal.fraction(),
                "cpu_expert_steal_frac": cpu_steal,
            },
        },
        model_shape={
            "name": topo.name,
            "hidden": H,
            "moe_intermediate": I,
            "expert_bytes": topo.expert_bytes,
            "n_moe_layers": topo.n_moe_layers,
            "n_experts": E,
        },
        h2d={"bytes": h2d_b, "seconds": h2d_s, "copies_per_expert": COPIES_PER_EXPERT},
        curves={
            "gpu_experts": {"experts": gr.experts, "tokens_per_expert": gr.tpe, "seconds": gpu},
            "gpu_experts_device": {"experts": gr.experts, "tokens_per_expert": gr.tpe, "seconds": gpu_dev},
            "cpu_expert": {
                "tokens": gr.tokens,
                "seconds": cpu.per_expert_s,
                "threads": cpu.threads,
                "engine": engine.name,
                "call_overhead_s": cpu.call_overhead_s,
                "mem_gbps": [round(g, 2) for g in cpu_gbps],
                "probe_s": cpu_probe,
                **({"settle_s": settle} if settle else {}),
                "calls": {
                    "one_expert_s": cpu.one_expert_s,
                    "many_experts": cpu.many_experts,
                    "many_s": cpu.many_s,
                    "band_experts": cpu.band_experts,
                    "band_s": cpu.band_s,
                },
                **({"bands": cpu.bands} if cpu.bands else {}),
                **({"ordering": engine.ordering} if engine.name == "kt" else {}),
            },
            "cpu_dispatch": {"tokens": gr.tokens, "seconds": disp},
            "non_expert": {"tokens": gr.ne_tokens, "kv_len": gr.kv, "seconds": ne},
            "dense_layer": {"tokens": gr.ne_tokens, "kv_len": gr.kv, "seconds": dn},
            "per_forward": {"tokens": gr.tokens, "seconds": fwd},
        },
        notes="Measured by dllm-profile; `method` holds how (docs/cost-model.md, how the profiler times each "
        "curve).",
        method={
            "repeats": gr.reps,
            "warmup_calls": gr.warmup,
            "passes": gr.passes,
            "grouped_backend": backend,
            "grouped_slot_block": MAX_GROUPS,
            "cpu_dtype": str(dtype),
            "cpu_engine": engine.name,
            **(
                {"cpu_kt_variant": engine.variant, "cpu_ordering": engine.ordering}
                if engine.name == "kt"
                else {}
            ),
            "cpu_threads": cpu.threads,
            "cpu_idle_s": CPU_IDLE_S,
            "cpu_experts_per_call": CPU_EXPERTS_PER_CALL,
            "cpu_call_max_tokens": CPU_CALL_MAX_TOKENS,
            "cpu_overhead_max_tokens": CPU_OVERHEAD_MAX_TOKENS,
            "cpu_bands": list(gr.cpu_bands),
            "cpu_probe_call": list(CPU_PROBE_CALL),
            "settle_tolerance": SETTLE_TOL,
            "contention_experts": CONTENTION_EXPERTS,
        },
    )
    progress("runtime")
    cm = CostModel(prof)  # the curves above
    cuts = cut_probes(
        topo, cm, dev, dtype
    )  # full residency on two cut depths, every miss on the CPU on the shallow one
    prof.runtime = {
        "routing_sync_s": float(np.median(sync)) if sync else 0.0,
        "bookkeeping_s": bookkeeping_seconds(cuts.resident),
    }
    # what a resident forward takes beyond the curves, the routing wait and the bookkeeping: per layer and per forward
    prof.runtime["layer_residual_s"], prof.runtime["forward_residual_s"] = residual_split(
        cuts.resident, cuts.deep, CostModel(prof)
    )
    prof.runtime.update(
        {"cpu_call_s": cpu_call_seconds(cuts.cpu, cm), "cpu_issue_s": cpu_issue_seconds(cuts.cpu)}
    )
    prof.runtime.update(
        copy_contention_slowdowns(topo, cm, dev, dtype, host=host, reps=gr.reps, warmup=gr.warmup)
    )
    prof.runtime["cpu_busy_gpu_s"] = cpu_busy_gpu_seconds(
        topo, cm, dev, dtype, host=host, reps=gr.reps, warmup=gr.warmup
    )
    prof.runtime["prefetch_start_s"] = prefetch_start_seconds(topo, cm, dev, dtype)
    stack = whole_stack_probe(topo, cm, dev, dtype)
    prof.runtime["grouped_issue_s"] = grouped_issue_seconds(stack)
    prof.runtime.update(beside_engine_terms(cuts.resident, cuts.cpu, prof.runtime["grouped_issue_s"]))
    prof.runtime["policy_time_factor"] = policy_time_factor(topo, cm, dev, dtype, probe=stack)
    return prof
