"""CPU expert engines: one MoE layer's CPU experts computed from host weights, started and collected by the runtime.

Two engines share one interface (``submit`` a layer, ``finish`` it into the layer's output):

- ``TorchCpuEngine``: the portable reference. PyTorch bf16 kernels per expert (``runtime.cpu_experts``) in a
  Python worker thread that waits for the activations' copy to the host.
- ``KtCpuEngine``: KTransformers' native BF16 MoE kernels (``kt-kernel``: AMX, AVX-512 or AVX2 variant), one
  native call per layer over all of its CPU experts, run by kt-kernel's own thread pool without the GIL. On a
  GPU it is ordered one of three ways (``ordering``):

  - ``host``: the runtime's thread, which has just waited for the layer's routing, copies the activations to
    pinned memory and starts the native task at once; after issuing the layer's GPU work it waits for the task
    and queues the result's copy and add on the compute stream. Two thread hand-offs per call (to kt-kernel's
    task thread and back).
  - ``stream``: the whole path on a CUDA stream of the engine's own: the activations' copy, the native task
    (started by a host function on the stream), the wait for it (a second host function) and the result's copy
    back; the compute stream waits for the path's end event. The host thread only enqueues, but each host
    function adds a hand-off to and from the CUDA driver's callback thread.
  - ``direct``: no hand-off at all. ``submit`` only stages the activations and routing; ``finish``, called once
    the runtime's thread has issued the layer's GPU work, runs the native MoE on that thread (with kt-kernel's
    pool threads), then queues the result's copy and add. The CPU experts start later (after the GPU work is
    issued) but skip the task thread's and the waiter's wake-ups.

  On a CPU-only machine the call runs synchronously either way (CI tests it against the reference).

``make_cpu_engine(name, ...)`` picks one: ``torch``, ``kt``, or ``auto`` (kt where it is installed).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from dllm_offload_sim.costmodel.profile import CPU_ENGINES, CPU_ORDERINGS, DEFAULT_CPU_ORDERING
from dllm_offload_sim.runtime.cpu_experts import CpuExperts, layer_jobs
from dllm_offload_sim.runtime.cuda_copies import batch_copier
from dllm_offload_sim.runtime.host_experts import HostExperts

ENGINES = ("auto", *CPU_ENGINES)
ORDERINGS = CPU_ORDERINGS  # how the native engine's call is ordered with the GPU's work (KtCpuEngine)
DEFAULT_ORDERING = DEFAULT_CPU_ORDERING


@dataclass
class CpuCallTimes:
    """Host-side seconds of one layer's CPU call. The reference engine fills every field; the native engine
    runs outside Python and leaves the worker-side ones at zero."""

    wait_x_s: float = 0.0  # the worker waiting for the activations on the host
    jobs_s: float = 0.0  # grouping each CPU expert's rows
    compute_s: float = 0.0  # the experts
    blocked_s: float = 0.0  # the runtime's thread waiting for the result
    start_delay_s: float = 0.0  # submitted -> the worker running it
    return_delay_s: float = 0.0  # the worker done -> the runtime's thread holding the result
    issue_s: float = 0.0  # the runtime's thread submitting the call
    # stream-ordered native calls: timing events around the whole path on the GPU's clock
    path: tuple | None = None
    # with stage_events: a timing event at the native task's end (before the result's copy)
    computed: object | None = None


class TorchCpuEngine:
    """The reference CPU engine: decides nothing; computes the experts it is given with PyTorch on the host, in
    a worker thread, and adds their weighted sum into the layer's output."""

    name = "torch"

    def __init__(self, host: HostExperts, device, threads: int | None = None, workers: int = 1):
        self.host, self.device = host, torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.cpu = CpuExperts(workers, threads=threads)
        self.threads = threads
        self._thread = ThreadPoolExecutor(1)
        # the native engine's option (its calls' stages on the GPU's clock); none here
        self.stage_events = False
        self._d2h = torch.cuda.Stream(device=self.device) if self.cuda else None
        self._host_x: dict = {}

    def reserve(self, tokens, k: int, hidden: int, dtype: torch.dtype) -> None:
        """Allocate the pinned activation buffer of each call size in ``tokens`` (activations ``dtype``) now: a first
        call of a size would otherwise pin it, milliseconds of host time, inside a timed forward. ``k`` (routing
        slots) is the native engine's concern."""
        if self.cuda:
            for T in tokens:
                if (T, hidden, dtype) not in self._host_x:
                    self._host_x[(T, hidden, dtype)] = torch.empty((T, hidden), dtype=dtype, pin_memory=True)

    def _to_host(self, x: torch.Tensor, current=None):
        """Start copying the activations to pinned host memory on the D2H stream, after the work queued so far
        on the current stream (the layer's non-expert part; ``current``: that stream where the caller knows it);
        returns (host tensor, event to wait on)."""
        if not self.cuda:
            return x, None
        key = (*x.shape, x.dtype)
        buf = self._host_x.get(key)
        if buf is None:
            buf = self._host_x[key] = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
        ready = torch.cuda.Event()
        ready.record(current)
        self._d2h.wait_event(ready)
        with torch.cuda.stream(self._d2h):
            buf.copy_(x, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self._d2h)
        return buf, done

    def _work(self, layer: int, experts, xh, ids: np.ndarray, weights: np.ndarray):
        t0 = time.perf_counter()
        x_cpu, done = xh
        if done is not None:
            done.synchronize()
        t1 = time.perf_counter()
        jobs = layer_jobs(self.host, layer, experts, ids, weights)
        # pinned, so that the result's copy to the GPU neither blocks the host nor queues behind expert copies
        out = torch.zeros((x_cpu.shape[0], x_cpu.shape[1]), dtype=torch.float32, pin_memory=self.cuda)
        t2 = time.perf_counter()
        y = self.cpu.run(x_cpu, jobs, out=out)
        t3 = time.perf_counter()
        return y, CpuCallTimes(wait_x_s=t1 - t0, jobs_s=t2 - t1, compute_s=t3 - t2), (t0, t3)

    def submit(
        self, layer: int, x: torch.Tensor, ids: np.ndarray, weights: np.ndarray, experts: list, current=None
    ):
        """Start the CPU experts ``experts`` of MoE layer ``layer`` on the activations ``x [T, H]`` (after the
        work queued on the current stream) with the routing ``ids``/``weights [T, k]``; returns a handle.
        ``current``: the current CUDA stream where the caller knows it (looking it up costs ~30 us of host time on a
        loaded GPU host); it must be the current stream, since the engine launches its GPU work there."""
        t0 = time.perf_counter()
        fut = self._thread.submit(self._work, layer, list(experts), self._to_host(x, current), ids, weights)
        return fut, t0, time.perf_counter() - t0

    def finish(self, handle, out: torch.Tensor, current=None) -> CpuCallTimes:
        """Add the call's result into ``out[:T]`` (on the engine's device; on a GPU the add is queued on the
        current stream, ``current`` where the caller knows it); returns where the host's time went."""
        fut, t_submit, issue = handle
        tw = time.perf_counter()
        y, times, (w0, w1) = fut.result()
        t_back = time.perf_counter()
        times.blocked_s = t_back - tw
        times.start_delay_s = w0 - t_submit
        times.return_delay_s = t_back - max(w1, tw)
        times.issue_s = issue
        out[: y.shape[0]] += y.to(self.device, non_blocking=True).to(out.dtype)
        return times

    def close(self) -> None:
        self._thread.shutdown()
        self.cpu.close()


def _first_rows(out: torch.Tensor, T: int) -> torch.Tensor:
    """``out[:T]``, or ``out`` itself where it has ``T`` rows: a caller that keeps the view passes it, and a fresh
    slice costs ~20 us of host time on a loaded GPU host."""
    return out if out.shape[0] == T else out[:T]


def default_native_threads() -> int:
    """kt-kernel threads where nothing says otherwise: every core but two, at least one. Beside its pool, kt-kernel's
    task thread spins on a core of its own, and a stream-ordered call's wait spins on the CUDA callback thread for the
    call's whole length, so during a call the runtime's own thread shares the cores with them (``bench_cpu_engine.py``
    times host work during a call at several thread counts)."""
    n = os.cpu_count() or 1
    return max(1, n - 2) if n > 4 else n


def subnormals_kept() -> bool:
    """Whether this thread computes with subnormal floats (IEEE), not flushing them to zero."""
    return bool((np.array([1e-310]) * 0.5)[0] != 0)


def import_kt_kernel():
    """``kt_kernel``, imported without changing this thread's floating-point mode: loading its libraries turns
    on flush-to-zero (fast-math start-up code), which would change every later float computation of the
    process; where it did, the mode is set back (its kernels' bf16 instructions do not read it)."""
    kept = subnormals_kept()
    import kt_kernel

    if kept and not subnormals_kept():
        torch.set_flush_denormal(False)
    return kt_kernel


def kt_kernel_variant() -> str | None:
    """The kt-kernel variant this host loads (``amx``, ``avx512_bf16``, ..., ``avx2``), or None where kt-kernel
    is not installed or offers no BF16 MoE."""
    try:
        kt_kernel = import_kt_kernel()
    except ImportError:
        return None
    moe = kt_kernel.kt_kernel_ext.moe
    if getattr(moe, "AMXBF16_MOE", None) is None and getattr(moe, "AVX2BF16_MOE", None) is None:
        return None
    return str(kt_kernel.__cpu_variant__)


# kt-kernel's BF16 MoE packs rows in blocks of 32: other widths crash its weight loader
KT_WIDTH_MULTIPLE = 32


def kt_unsupported(topo) -> str | None:
    """Why kt-kernel's BF16 MoE cannot hold experts of ``topo`` (a model topology), or None where it can: its
    hidden and expert intermediate sizes must be multiples of :data:`KT_WIDTH_MULTIPLE` (other widths crash its
    weight loader: a segfault, not an error the engine could catch)."""
    bad = [
        f"{name} {v}"
        for name, v in (("hidden", topo.hidden), ("moe_intermediate", topo.moe_intermediate))
        if v % KT_WIDTH_MULTIPLE
    ]
    return f"{' and '.join(bad)} not a multiple of {KT_WIDTH_MULTIPLE}" if bad else None


class KtCpuEngine:
    """The native CPU engine: decides nothing; runs a layer's CPU experts as one kt-kernel BF16 MoE task
    (the experts of other paths masked out of the routing), GIL-free, on ``threads`` native threads.

    Weights: one kt-kernel MoE per real layer of ``host``, built from pointers into its ``w13``/``w2`` (gate,
    up and down of each expert; kt-kernel packs them for its kernels at load). ``max_tokens`` bounds the
    tokens of one call. Results come back in bf16 (kt-kernel's output type), so they equal the reference's
    up to bf16 rounding of the layer's CPU sum. ``ordering``: ``host``, ``stream`` or ``direct`` (the module's
    docstring).
    """

    name = "kt"

    def __init__(
        self,
        host: HostExperts,
        device,
        threads: int | None = None,
        max_tokens: int = 1024,
        ordering: str = DEFAULT_ORDERING,
    ):
        if ordering not in ORDERINGS:
            raise ValueError(f"ordering={ordering!r}: expected one of {', '.join(ORDERINGS)}")
        variant = kt_kernel_variant()
        if variant is None:
            raise ImportError(
                "cpu_engine=kt needs kt-kernel with a BF16 MoE: pip install --no-deps "
                "kt-kernel==0.7.2 gguf (or cpu_engine=torch)"
            )
        ext = import_kt_kernel().kt_kernel_ext
        self.variant, self.host, self.device, self.ordering = variant, host, torch.device(device), ordering
        self.cuda = self.device.type == "cuda"
        self.threads = int(threads or default_native_threads())
        self.max_tokens = int(max_tokens)
        topo = host.topo
        E, k, H, I = topo.n_experts, topo.top_k, topo.hidden, topo.moe_intermediate
        if host.w13.dtype != torch.bfloat16:
            raise TypeError(f"cpu_engine=kt computes in bf16; the host experts are {host.w13.dtype}")
        why = kt_unsupported(topo)
        if why:
            raise ValueError(
                f"cpu_engine=kt: kt-kernel's BF16 MoE cannot hold these experts ({why}); use cpu_engine=torch"
            )
        pool = ext.WorkerPoolConfig()
        pool.subpool_count, pool.subpool_numa_map, pool.subpool_thread_count = 1, [0], [self.threads]
        self._cpu = ext.CPUInfer(pool)
        moe_cls = getattr(ext.moe, "AMXBF16_MOE", None) or ext.moe.AVX2BF16_MOE
        self._mask = torch.zeros(E, dtype=torch.bool)  # no expert skipped by mask: the routing says which run
        self._moes = []
        p2l = torch.arange(E, dtype=torch.long)
        for r in range(host.n_real):
            cfg = ext.moe.MOEConfig(E, k, H, I, self._mask.data_ptr())
            cfg.layer_idx, cfg.pool, cfg.max_len, cfg.swiglu_limit = (
                r,
                self._cpu.backend_,
                self.max_tokens,
                0.0,
            )
            cfg.gate_projs = [[host.w13[r, e, :I].data_ptr() for e in range(E)]]
            cfg.up_projs = [[host.w13[r, e, I:].data_ptr() for e in range(E)]]
            cfg.down_projs = [[host.w2[r, e].data_ptr() for e in range(E)]]
            cfg.gate_scales = cfg.up_scales = cfg.down_scales = [[0] * E]
            moe = moe_cls(cfg)
            self._cpu.submit(moe.load_weights_task(p2l.data_ptr()))
            self._cpu.sync()
            self._moes.append((moe, cfg))
        self._stream = torch.cuda.Stream(device=self.device) if self.cuda else None  # stream ordering's path
        # the path's two copies, one call each
        self._copier = batch_copier(self.device) if self.cuda else None
        self._on_cpu = np.zeros(E, bool)  # which experts a call runs (refilled by each call)
        self.stage_events = False  # stream-ordered calls also time their task's end (CpuCallTimes.computed)
        self._bufs: dict = {}  # (tokens, routing slots, set) -> pinned buffers of one call
        self._next_set: dict = {}  # (tokens, routing slots) -> the buffer set the next call of that shape takes

    def _buffers(self, T: int, k: int, H: int):
        """A set of call buffers for ``T`` tokens: two sets per size, taken in turn, so that the host fills one
        while a queued call may still read the other; a set whose last call has not finished is waited for. A set
        keeps numpy views of its routing, the native call's arguments and the event that orders its path after
        the compute stream, so that a call only fills them."""
        i = self._next_set.get((T, k), 0)
        self._next_set[(T, k)] = i ^ 1
        b = self._bufs.get((T, k, i))
        if b is not None:
            if b["done"] is not None:
                b["done"].synchronize()  # its last call has read its routing (at once unless two are queued)
            return b
        return self._allocate(T, i, k, H)

    def reserve(self, tokens, k: int, hidden: int, dtype: torch.dtype = torch.bfloat16) -> None:
        """Allocate both buffer sets of each call size in ``tokens`` (at most ``max_tokens``) with ``k`` routing
        slots now: pinning them takes milliseconds of host time, which a first call of a size would otherwise
        spend inside a timed forward. (``dtype``: the activations'; this engine's buffers are bf16 always.)"""
        for T in tokens:
            if T <= self.max_tokens:
                for i in (0, 1):
                    if (T, k, i) not in self._bufs:
                        self._allocate(T, i, k, hidden)

    def _allocate(self, T: int, i: int, k: int, H: int):
        """Buffer set ``i`` of call size ``T`` (see :meth:`_buffers`)."""
        pin = self.cuda
        b = self._bufs[(T, k, i)] = {
            "bsz": torch.full((1,), T, dtype=torch.int32, pin_memory=pin),
            "ids": torch.full((T, k), -1, dtype=torch.int64, pin_memory=pin),
            "w": torch.zeros((T, k), dtype=torch.float32, pin_memory=pin),
            "x": torch.zeros((T, H), dtype=torch.bfloat16, pin_memory=pin),
            "y": torch.zeros((T, H), dtype=torch.bfloat16, pin_memory=pin),
            "y_dev": torch.zeros((T, H), dtype=torch.bfloat16, device=self.device) if self.cuda else None,
            "done": None,  # the event that ends this set's last call on the engine's stream
            "ready": torch.cuda.Event() if self.cuda else None,  # the compute stream's point the path follows
        }
        b["ids_np"], b["w_np"] = b["ids"].numpy(), b["w"].numpy()
        b["args"] = (
            b["bsz"].data_ptr(),
            k,
            b["ids"].data_ptr(),
            b["w"].data_ptr(),
            b["x"].data_ptr(),
            b["y"].data_ptr(),
            False,
        )
        return b

    def submit(
        self, layer: int, x: torch.Tensor, ids: np.ndarray, weights: np.ndarray, experts: list, current=None
    ):
        """Start the CPU experts ``experts`` of MoE layer ``layer`` (see ``TorchCpuEngine.submit``)."""
        t0 = time.perf_counter()
        T, k = ids.shape
        if T > self.max_tokens:
            raise ValueError(f"cpu_engine=kt: a call of {T} tokens exceeds max_tokens={self.max_tokens}")
        b = self._buffers(T, k, x.shape[1])
        on_cpu = self._on_cpu
        on_cpu[:] = False
        on_cpu[experts] = True
        ids_b = b["ids_np"]
        ids_b.fill(-1)  # the experts of other paths are masked out of the routing
        np.copyto(ids_b, ids, where=on_cpu[ids])
        np.copyto(b["w_np"], weights, casting="same_kind")
        moe = self._moes[layer % self.host.n_real][0]
        if self.ordering == "direct":  # run at finish, on the runtime's thread
            b["x"].copy_(x)
            b["run"] = (moe, b["args"])
            return b, None, time.perf_counter() - t0
        task = moe.forward_task(*b["args"])
        if (
            not self.cuda or self.ordering == "host"
        ):  # on a GPU the copy waits for the layer's work queued so far
            b["x"].copy_(x)
            self._cpu.submit(task)
            return b, None, time.perf_counter() - t0
        s, ready = self._stream, b["ready"]
        ready.record(self._current(current))  # after the layer's non-expert work
        s.wait_event(ready)
        start = torch.cuda.Event(enable_timing=True)
        start.record(s)  # the path starts once the layer's activations are ready
        sid, nbytes = s.cuda_stream, T * x.shape[1] * x.element_size()
        raw = (
            self._copier is not None
            and x.is_contiguous()
            and x.dtype == torch.bfloat16
            and x.shape == b["x"].shape
        )
        if raw:
            self._copier.copy_one(b["x"].data_ptr(), x.data_ptr(), nbytes, sid)
        else:
            with torch.cuda.stream(s):
                b["x"].copy_(x, non_blocking=True)
        self._cpu.submit_with_cuda_stream(sid, task)
        self._cpu.sync_with_cuda_stream(sid, 0)
        computed = None
        if self.stage_events:
            computed = torch.cuda.Event(enable_timing=True)
            computed.record(s)
        if raw:
            self._copier.copy_one(b["y_dev"].data_ptr(), b["y"].data_ptr(), nbytes, sid)
        else:
            with torch.cuda.stream(s):
                b["y_dev"].copy_(b["y"], non_blocking=True)
        done = torch.cuda.Event(enable_timing=True)
        done.record(s)
        b["done"], b["start"], b["computed"] = done, start, computed
        return b, done, time.perf_counter() - t0

    def finish(self, handle, out: torch.Tensor, current=None) -> CpuCallTimes:
        """Add the call's result into ``out[:T]`` (``out`` itself where it has ``T`` rows): stream-ordered, the current
        stream (``current`` where the caller knows it) waits for the CPU path's end (the host does not); host-ordered,
        the host waits for the native task (direct: runs it), then (on a GPU) queues the result's copy and add on the
        current stream."""
        b, done, issue = handle
        T = b["ids"].shape[0]
        if done is None:
            tw = time.perf_counter()
            run = b.pop("run", None)
            if run is not None:  # direct: the native MoE on this thread
                run[0].forward(*run[1])
            else:
                self._cpu.sync()
            blocked = time.perf_counter() - tw
            if self.cuda:
                b["y_dev"].copy_(b["y"], non_blocking=True)
                _first_rows(out, T).add_(b["y_dev"])
                b["done"] = torch.cuda.Event()
                b["done"].record(current)  # the set's result is read by then: its next call may overwrite it
            else:
                out[:T] += b["y"].to(out.dtype)
            return CpuCallTimes(blocked_s=blocked, issue_s=issue)
        self._current(current).wait_event(done)
        _first_rows(out, T).add_(b["y_dev"])  # one kernel: bf16 read into the fp32 sum
        return CpuCallTimes(issue_s=issue, path=(b["start"], done), computed=b["computed"])

    def _current(self, current):
        """The current stream: ``current`` where the caller passed it, else looked up."""
        return current if current is not None else torch.cuda.current_stream(self.device)

    def close(self) -> None:
        """Wait for queued calls, then free the kernels' weights and the thread pool at once (a sweep makes
        one engine per run: two live pools would share the cores). The engine is unusable after."""
        if self._cpu is None:
            return
        self._cpu.sync()
        self._bufs.clear()
        self._moes.clear()
        self._cpu = None


def make_cpu_engine(
    name: str,
    host: HostExperts,
    device,
    threads: int | None = None,
    max_tokens: int = 1024,
    workers: int = 1,
    ordering: str = DEFAULT_ORDERING,
):
    """The CPU engine ``name`` (one of ``ENGINES``) over ``host``'s experts; ``auto`` is kt-kernel where it
    is installed with a BF16 MoE and the experts are bf16 of widths it takes (:func:`kt_unsupported`), else the
    PyTorch reference (with ``workers`` experts
    at a time). ``ordering`` applies to the native engine (``KtCpuEngine``)."""
    if name not in ENGINES:
        raise ValueError(f"cpu_engine={name!r}: expected one of {', '.join(ENGINES)}")
    native = (
        host.w13.dtype == torch.bfloat16
        and kt_unsupported(host.topo) is None
        and kt_kernel_variant() is not None
    )
    if name == "kt" or (name == "auto" and native):
        return KtCpuEngine(host, device, threads=threads, max_tokens=max_tokens, ordering=ordering)
    return TorchCpuEngine(host, device, threads=threads, workers=workers)


def profiled_cpu_engine(
    cost, host: HostExperts, device, engine: str | None = None, workers: int = 1, max_tokens: int = 2048
):
    """The CPU engine as the profile measured it: its engine (``cost.cpu_engine``) unless ``engine`` names one,
    with the profile's threads (at most this host's cores), or the engine's default where it does not say, and
    the profile's ordering (``cost.cpu_ordering``)."""
    threads = cost.cpu_expert_threads
    threads = min(threads, os.cpu_count() or threads) if threads else None
    return make_cpu_engine(
        engine or cost.cpu_engine,
        host,
        device,
        threads=threads,
        max_tokens=max_tokens,
        workers=workers,
        ordering=cost.cpu_ordering,
    )
