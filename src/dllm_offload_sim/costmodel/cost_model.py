"""CostModel: modelled durations from a hardware profile, answered in O(1).

Curves are piecewise linear between profiled points; beyond the last point they continue with the
last segment's slope (never decreasing), below the first they hold the first value. H2D time is the
affine fit ``latency + bytes / bandwidth`` of the profiled copies, and a PCIe-bandwidth sweep
replaces the bandwidth term, as the paper emulates 16-128 GB/s by scaling transfer latency.
"""

from __future__ import annotations

import copy
from bisect import bisect_right
from functools import partial
from typing import NamedTuple

import numpy as np

from dllm_offload_sim.costmodel.contention import (
    STALL_PROBE_EXPERTS,
    OverlapEnds,
    overlapped_ends,
    slowdown_from_stall,
)
from dllm_offload_sim.costmodel.runtime_terms import runtime_value
from dllm_offload_sim.costmodel.profile import (
    DEFAULT_COPIES_PER_EXPERT,
    DEFAULT_CPU_ORDERING,
    HardwareProfile,
    ProfileError,
    load_profile,
)
from dllm_offload_sim.policies.curves import GpuCallCurves


TABLE_TOKENS = 8192  # token counts answered by table lookup


class Curve1D:
    """A profile curve over one axis: linear between its points, its first value below them, and past the last point
    extended by the last segment's slope (never falling)."""

    def __init__(self, xs, ys):
        self.xs, self.ys = [float(x) for x in xs], [float(y) for y in ys]
        n = len(self.xs)
        self.tail = max((self.ys[-1] - self.ys[-2]) / (self.xs[-1] - self.xs[-2]), 0.0) if n > 1 else 0.0

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1] + (x - xs[-1]) * self.tail
        i = bisect_right(xs, x) - 1
        f = (x - xs[i]) / (xs[i + 1] - xs[i])
        return ys[i] + f * (ys[i + 1] - ys[i])


class _CpuBand(NamedTuple):
    """A CPU call's experts beyond its ``after`` with the most tokens: their cost per expert by token count (``table``
    for counts below ``TABLE_TOKENS``, ``curve`` beyond)."""

    after: int
    table: list
    curve: Curve1D


class _Curve2D:
    """Bilinear over a grid; along each axis it extends like :class:`Curve1D`."""

    def __init__(self, xs, ys, zs):
        self.cols = [Curve1D(ys, row) for row in np.asarray(zs, float)]  # one curve in y per x
        self.xs = [float(x) for x in xs]

    def __call__(self, x: float, y: float) -> float:
        xs = self.xs
        if len(xs) == 1:
            return self.cols[0](y)
        if x <= xs[0]:
            return self.cols[0](y)
        if x >= xs[-1]:
            a, b = self.cols[-2](y), self.cols[-1](y)
            return b + (x - xs[-1]) * max((b - a) / (xs[-1] - xs[-2]), 0.0)
        i = bisect_right(xs, x) - 1
        f = (x - xs[i]) / (xs[i + 1] - xs[i])
        a, b = self.cols[i](y), self.cols[i + 1](y)
        return a + f * (b - a)


def fit_h2d(bytes_, seconds) -> tuple[float, float]:
    """Least-squares ``seconds = latency + bytes / bandwidth``; returns (latency_s, bandwidth_Bps)."""
    b, s = np.asarray(bytes_, float), np.asarray(seconds, float)
    slope, intercept = np.polyfit(b, s, 1)
    if slope <= 0:
        raise ProfileError("<profile>", "h2d", "copy time does not grow with bytes; cannot fit a bandwidth")
    return max(float(intercept), 0.0), 1.0 / float(slope)


class CostModel:
    """Modelled seconds for every operation the simulator schedules, from one profile."""

    def __init__(
        self,
        profile: HardwareProfile | str,
        pcie_gbps: float | None = None,
        expert_bytes: int | None = None,
        policy_us_per_layer: float | None = None,
    ):
        if not isinstance(profile, HardwareProfile):
            profile = load_profile(profile)
        self.profile = profile
        self.h2d_latency_s, measured_bw = fit_h2d(profile.h2d["bytes"], profile.h2d["seconds"])
        if pcie_gbps is not None:
            if not isinstance(pcie_gbps, (int, float)) or not np.isfinite(pcie_gbps) or pcie_gbps <= 0:
                raise ProfileError(
                    profile.path or profile.name,
                    "hw.pcie_gbps",
                    f"bandwidth must be a positive number of GB/s, got {pcie_gbps!r}",
                )
            self.h2d_bandwidth = float(pcie_gbps) * 1e9
        else:
            self.h2d_bandwidth = measured_bw
        self.measured_h2d_bandwidth = measured_bw
        self.expert_bytes = int(
            expert_bytes if expert_bytes is not None else profile.model_shape["expert_bytes"]
        )
        self._hidden = int(profile.model_shape["hidden"])
        c = profile.curves
        self._gpu = _Curve2D(
            c["gpu_experts"]["experts"], c["gpu_experts"]["tokens_per_expert"], c["gpu_experts"]["seconds"]
        )
        dv = c.get("gpu_experts_device")
        self._gpu_dev = _Curve2D(dv["experts"], dv["tokens_per_expert"], dv["seconds"]) if dv else None
        self.cpu_call_overhead_s = float(c["cpu_expert"].get("call_overhead_s", 0.0))
        self.cpu_expert_threads = int(c["cpu_expert"].get("threads") or 0) or None  # the engine's threads
        self.cpu_engine = str(c["cpu_expert"].get("engine", "torch"))  # the CPU engine the curve measured
        self.cpu_ordering = str(
            c["cpu_expert"].get("ordering", DEFAULT_CPU_ORDERING)
        )  # and how its calls were ordered
        self._cpu = Curve1D(c["cpu_expert"]["tokens"], c["cpu_expert"]["seconds"])
        self._dispatch = Curve1D(c["cpu_dispatch"]["tokens"], c["cpu_dispatch"]["seconds"])
        self._dispatch_memo: dict = {}  # tokens -> cpu_dispatch_seconds (policies ask per layer)
        self._ne = _Curve2D(c["non_expert"]["tokens"], c["non_expert"]["kv_len"], c["non_expert"]["seconds"])
        self._dense = _Curve2D(
            c["dense_layer"]["tokens"], c["dense_layer"]["kv_len"], c["dense_layer"]["seconds"]
        )
        self._fwd = Curve1D(c["per_forward"]["tokens"], c["per_forward"]["seconds"])
        self.policy_per_layer_s = float(profile.policy_per_layer_s)
        # the runtime's terms (costmodel.runtime_terms: what each is and its default where the profile lacks it)
        rt = profile.runtime or {}
        term = partial(runtime_value, rt)
        # per MoE layer: waiting for the routing, bookkeeping, the rest of a resident layer's host work
        self.layer_overhead_s = term("routing_sync_s") + term("bookkeeping_s") + term("layer_residual_s")
        self.forward_residual_s = term("forward_residual_s")
        self.cpu_call_in_replay_s = term("cpu_call_s")
        self.cpu_issue_s = term("cpu_issue_s")
        self.prefetch_start_s = term("prefetch_start_s")
        self.cpu_busy_gpu_s = term("cpu_busy_gpu_s")
        self.grouped_issue_s = term("grouped_issue_s")
        # beside the CPU expert engine; a profile that did not measure them charges as without the engine
        self.grouped_issue_cpu_s = term("grouped_issue_cpu_s")
        bk = term("bookkeeping_s")
        self.bookkeeping_after_cpu_s = max(term("bookkeeping_cpu_s") - bk, 0.0)
        self.policy_time_factor = term("policy_time_factor")
        if policy_us_per_layer is not None:  # a policy's decision time, e.g. as measured by the validator
            if not np.isfinite(policy_us_per_layer) or policy_us_per_layer < 0:
                raise ProfileError(
                    profile.path or profile.name,
                    "hw.policy_us_per_layer",
                    f"must be a number >= 0, got {policy_us_per_layer!r}",
                )
            self.policy_per_layer_s = float(policy_us_per_layer) * 1e-6
        # the measured runtime copies an expert in `copies_per_expert` copies: one latency each
        self.copies_per_expert = int(profile.h2d.get("copies_per_expert", DEFAULT_COPIES_PER_EXPERT))
        self._expert_h2d = (
            self.copies_per_expert * self.h2d_latency_s + self.expert_bytes / self.h2d_bandwidth
        )
        # lookup tables built once (the hot loop indexes them): CPU cost per integer token count,
        # and the grouped-GPU curve pre-cut at every integer expert count
        self.cpu_table_list = [0.0] + [self._cpu(n) for n in range(1, TABLE_TOKENS)]
        self.cpu_table = np.array(self.cpu_table_list)
        # a large call's later experts (by tokens, most first) at their band's cost
        self._cpu_bands = []
        for b in c["cpu_expert"].get("bands") or ():
            curve = Curve1D(c["cpu_expert"]["tokens"], b["seconds"])
            self._cpu_bands.append(
                _CpuBand(int(b["after"]), [0.0] + [curve(n) for n in range(1, TABLE_TOKENS)], curve)
            )
        g = c["gpu_experts"]
        self._gpu_curves = None  # gpu_call_curves, made on first use
        self._gpu_by_n = [None] + [
            Curve1D(g["tokens_per_expert"], [self._gpu(n, t) for t in g["tokens_per_expert"]])
            for n in range(1, int(max(g["experts"])) + 1)
        ]
        # a CPU call and the demand copies beside it share host memory (costmodel.contention); a profile measured
        # before the two slowdowns holds the old probe's delay per copy, read as one slowdown shared by both
        self.contention_from_stall = (
            "cpu_slowdown_beside_copies" not in rt and "copies_slowdown_beside_cpu" not in rt
        )
        if self.contention_from_stall:
            probe_s = self.cpu_dispatch_seconds(STALL_PROBE_EXPERTS) + sum(
                self.cpu_call_costs([1] * STALL_PROBE_EXPERTS)
            )
            self.cpu_slowdown_beside_copies = self.copies_slowdown_beside_cpu = slowdown_from_stall(
                term("cpu_stall_per_copy_s"), probe_s
            )
        else:
            self.cpu_slowdown_beside_copies = term("cpu_slowdown_beside_copies")
            self.copies_slowdown_beside_cpu = term("copies_slowdown_beside_cpu")

    def with_policy_time(self, us_per_layer: float) -> "CostModel":
        """The same model charging ``us_per_layer`` microseconds of policy decision per MoE layer."""
        if not np.isfinite(us_per_layer) or us_per_layer < 0:
            raise ProfileError(
                self.profile.path or self.profile.name,
                "policy_us_per_layer",
                f"must be a number >= 0, got {us_per_layer!r}",
            )
        c = copy.copy(self)
        c.policy_per_layer_s = float(us_per_layer) * 1e-6
        return c

    @property
    def pcie_gbps(self) -> float:
        return self.h2d_bandwidth / 1e9

    def h2d_seconds(self, nbytes: float) -> float:
        """One pinned host-to-device copy of ``nbytes``."""
        return self.h2d_latency_s + nbytes / self.h2d_bandwidth

    def expert_h2d_seconds(self) -> float:
        """Copying one routed expert's weights to the GPU (its ``copies_per_expert`` copies)."""
        return self._expert_h2d

    def gpu_experts_seconds(self, n_experts: int, tokens_per_expert: float) -> float:
        """One grouped GPU call over ``n_experts`` experts with ``tokens_per_expert`` tokens on average."""
        if n_experts <= 0:
            return 0.0
        if n_experts < len(self._gpu_by_n):
            return self._gpu_by_n[n_experts](tokens_per_expert)
        return self._gpu(n_experts, tokens_per_expert)

    def gpu_call_curves(self) -> GpuCallCurves:
        """The curves :meth:`gpu_experts_seconds` reads, as arrays for compiled decisions (``policies.curves``)."""
        curves = self._gpu_curves
        if curves is None:
            by_n, cols = self._gpu_by_n[1:], self._gpu.cols
            k = len(cols[0].xs)
            curves = self._gpu_curves = GpuCallCurves(
                tokens=np.array(cols[0].xs, np.float64),
                by_n=np.array([[0.0] * k] + [c.ys for c in by_n], np.float64),
                by_n_tail=np.array([0.0] + [c.tail for c in by_n], np.float64),
                experts=np.array(self._gpu.xs, np.float64),
                grid=np.array([c.ys for c in cols], np.float64),
                grid_tail=np.array([c.tail for c in cols], np.float64),
            )
        return curves

    def gpu_experts_device_seconds(self, n_experts: int, tokens_per_expert: float) -> float:
        """The kernels of that call alone (GPU time): what remains of the call once the host has issued it
        ahead of the copies it waits for. Without a device curve in the profile, the whole call."""
        if n_experts <= 0:
            return 0.0
        if self._gpu_dev is None:
            return self.gpu_experts_seconds(n_experts, tokens_per_expert)
        return min(
            self._gpu_dev(n_experts, tokens_per_expert),
            self.gpu_experts_seconds(n_experts, tokens_per_expert),
        )

    def grouped_call_seconds(
        self, n_experts: int, pairs: int, beside_cpu: bool = False
    ) -> tuple[float, float]:
        """(seconds issued with the GPU idle, seconds of its kernels alone) of one grouped call over
        ``n_experts`` experts and ``pairs`` (token, expert) pairs in all. Issued, it takes at least the runtime's
        host time of issuing a call (``runtime.grouped_issue_s``, or ``grouped_issue_cpu_s`` ``beside_cpu``: in a
        layer whose CPU call runs meanwhile) before its kernels."""
        if n_experts <= 0:
            return 0.0, 0.0
        dev = self.gpu_experts_device_seconds(n_experts, pairs / n_experts)
        issued = self.gpu_experts_seconds(n_experts, pairs / n_experts)
        return max(issued, (self.grouped_issue_cpu_s if beside_cpu else self.grouped_issue_s) + dev), dev

    def cpu_and_copies(
        self, cpu_start: float, cpu_end: float, copies_start: float, copies_end: float
    ) -> OverlapEnds:
        """When a CPU call and the demand copies beside it end (:func:`~dllm_offload_sim.costmodel.contention.overlapped_ends`
        with this profile's slowdowns), given when each would end alone."""
        return overlapped_ends(
            cpu_start,
            cpu_end,
            copies_start,
            copies_end,
            self.cpu_slowdown_beside_copies,
            self.copies_slowdown_beside_cpu,
        )

    def cpu_expert_seconds(self, tokens: int) -> float:
        """One expert FFN for ``tokens`` tokens on the CPU."""
        if tokens < TABLE_TOKENS:
            return (
                self.cpu_table_list[tokens] if tokens > 0 else 0.0
            )  # the list: a Python float, not np.float64
        return self._cpu(tokens)

    def cpu_call_costs(self, tokens: list) -> list:
        """Seconds of each expert of one CPU call over experts of ``tokens`` tokens each, in that order: the first
        experts, by tokens (most first), at :meth:`cpu_expert_seconds`; with ``cpu_expert.bands`` in the profile, each
        one beyond a band's ``after`` at that band's cost. Their sum is the call's time after its fixed cost."""
        bands = self._cpu_bands
        if not bands or len(tokens) <= bands[0].after:  # the simulator's hot path: table lookups
            tbl = self.cpu_table_list
            return [tbl[t] if t < TABLE_TOKENS else self.cpu_expert_seconds(t) for t in tokens]
        out = [0.0] * len(tokens)
        ranked = sorted(range(len(tokens)), key=tokens.__getitem__, reverse=True)
        table, curve, b = self.cpu_table_list, self._cpu, -1
        for rank, i in enumerate(ranked):
            while b + 1 < len(bands) and rank >= bands[b + 1].after:
                b += 1
                table, curve = bands[b].table, bands[b].curve
            t = int(tokens[i])
            out[i] = (table[t] if t < TABLE_TOKENS else curve(t)) if t > 0 else 0.0
        return out

    def cpu_call_tables(self) -> tuple[np.ndarray, np.ndarray]:
        """What :meth:`cpu_call_costs` reads, as arrays for compiled code: ``afters`` (the rank, most tokens first,
        from which each band's cost applies; empty without bands) and ``tables`` (``[1 + bands, TABLE_TOKENS]``: row 0
        the expert's cost by tokens, row b + 1 band b's)."""
        afters = np.array([b.after for b in self._cpu_bands], np.int64)
        tables = np.array([self.cpu_table_list] + [b.table for b in self._cpu_bands], np.float64)
        return afters, tables

    def cpu_experts_seconds(self, tokens: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`cpu_expert_seconds` over an integer array of token counts."""
        t = np.asarray(tokens, np.int64)
        if t.size and t.max() >= TABLE_TOKENS:
            return np.array([self.cpu_expert_seconds(int(x)) for x in t])
        return self.cpu_table[t]

    def cpu_dispatch_seconds(self, tokens: int) -> float:
        """Activations to the CPU and results back, plus the fixed cost of the CPU call (isolated, and what
        the running replay adds: profile ``runtime.cpu_call_s``), once per layer that runs experts on the CPU."""
        v = self._dispatch_memo.get(tokens)
        if v is None:
            v = self._dispatch_memo[tokens] = (
                self._dispatch(tokens) + self.cpu_call_overhead_s + self.cpu_call_in_replay_s
            )
        return v

    def cpu_result_seconds(self, tokens: int) -> float:
        """The copy of a layer's CPU result (``tokens`` rows of the hidden size, bf16) to the GPU: part of
        :meth:`cpu_dispatch_seconds`, and what the result still takes once the layer's demand copies, which it
        queues behind on the copy engine, have landed."""
        return self.h2d_seconds(tokens * self._hidden * 2)

    def non_expert_seconds(self, tokens: int, kv_len: int) -> float:
        """Attention, norms, gate and shared expert of one MoE layer."""
        return self._ne(tokens, kv_len)

    def dense_layer_seconds(self, tokens: int, kv_len: int) -> float:
        return self._dense(tokens, kv_len)

    def per_forward_seconds(self, tokens: int) -> float:
        """Embedding, final norm, lm-head and sampling of one forward."""
        return self._fwd(tokens)

    def describe(self) -> dict:
        return {
            "profile": self.profile.name,
            "status": self.profile.status,
            "pcie_gbps": round(self.pcie_gbps, 3),
            "h2d_latency_us": round(self.h2d_latency_s * 1e6, 3),
            "expert_h2d_us": round(self._expert_h2d * 1e6, 3),
            "layer_overhead_us": round(self.layer_overhead_s * 1e6, 3),
            "forward_residual_us": round(self.forward_residual_s * 1e6, 3),
            "cpu_call_in_replay_us": round(self.cpu_call_in_replay_s * 1e6, 3),
            "cpu_issue_us": round(self.cpu_issue_s * 1e6, 3),
            "cpu_slowdown_beside_copies": round(self.cpu_slowdown_beside_copies, 4),
            "copies_slowdown_beside_cpu": round(self.copies_slowdown_beside_cpu, 4),
            "cpu_busy_gpu_us": round(self.cpu_busy_gpu_s * 1e6, 3),
            "grouped_issue_us": round(self.grouped_issue_s * 1e6, 3),
            "grouped_issue_cpu_us": round(self.grouped_issue_cpu_s * 1e6, 3),
            "bookkeeping_after_cpu_us": round(self.bookkeeping_after_cpu_s * 1e6, 3),
        }
