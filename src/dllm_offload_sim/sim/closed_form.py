"""A forward whose every layer is timed in closed form, compiled: the engine's timeline without events.

A run whose policy never prefetches keeps the copy engine idle between layers, so every MoE layer's timeline is the
closed form of :mod:`sim.engine` (demand copies land as on an idle copy engine; nothing interleaves). The engine then
decides a whole forward's layers first (the policy, the driver, the counters: none of it reads the clock) and times
them with :func:`time_forward`, the closed form's arithmetic (``schedule.timeline.layer_span`` and
``costmodel.contention.overlapped_ends``) in the same order of operations, compiled. The Python engine times the same
layers as events or one by one (``Simulation(closed_form=False)``, or a policy that prefetches), and a test holds the
two to the bit (``tests/test_closed_form.py``).

A layer's grouped GPU calls are one row of an :class:`ExpertCallsTable`, which the runs of one cost model may share.
"""

from __future__ import annotations

import numpy as np

from dllm_offload_sim.policies.jit import kernel
from dllm_offload_sim.schedule.timeline import ExpertCalls, layer_expert_calls

# the columns of a calls table row: the hits' call, the copied experts' call and the call over both (each: seconds
# issued on an idle GPU, seconds of its kernels), the copies on an idle copy engine, one call over both, the copies'
# wait behind the hits' call's host part, and whether anything is copied
HIT_S, HIT_DEV, COPIED_S, COPIED_DEV, BOTH_S, BOTH_DEV, COPIES_S, TOGETHER, WAIT_S, HAS_COPIED = range(10)
CALL_COLUMNS = 10

# what time_forward returns in its ``out`` array: the forward's CPU-path seconds, how much later its CPU calls
# computed beside demand copies, and how much later its demand copies landed beside CPU calls
CPU_PATH, CPU_SLOWED, COPIES_SLOWED = range(3)


def calls_row(calls: ExpertCalls) -> tuple:
    """``calls`` as a row of the calls table (NaN where it has no copied call)."""
    nan = float("nan")
    cop, both = calls.copied, calls.both
    return (
        calls.hit[0],
        calls.hit[1],
        nan if cop is None else cop[0],
        nan if cop is None else cop[1],
        nan if both is None else both[0],
        nan if both is None else both[1],
        calls.copies_s,
        1.0 if calls.together else 0.0,
        calls.copies_wait_s,
        0.0 if cop is None else 1.0,
    )


@kernel
def _calls_end(c, t0, arrive):  # pragma: no cover (numba)
    """``ExpertCalls.end(t0, arrive)`` of calls table row ``c``."""
    if c[HAS_COPIED] == 0.0:
        return t0 + c[HIT_S]
    if c[TOGETHER] != 0.0:
        return max(t0 + c[BOTH_S] - c[BOTH_DEV], arrive) + c[BOTH_DEV]
    return (
        max(t0 + c[HIT_S], t0 + (c[HIT_S] - c[HIT_DEV]) + (c[COPIED_S] - c[COPIED_DEV]), arrive)
        + c[COPIED_DEV]
    )


@kernel
def _overlapped(
    cpu_start, cpu_end, copies_start, copies_end, cpu_slowdown, copies_slowdown
):  # pragma: no cover
    """``costmodel.contention.overlapped_ends``: (CPU end, copies end, CPU delay, copies delay)."""
    s = max(cpu_start, copies_start)
    rc, rh = cpu_end - s, copies_end - s
    if rc <= 0 or rh <= 0 or (cpu_slowdown <= 0 and copies_slowdown <= 0):
        return cpu_end, copies_end, 0.0, 0.0
    tc, th = rc * (1 + cpu_slowdown), rh * (1 + copies_slowdown)
    if tc <= th:
        cpu, copies = s + tc, s + tc + rh - tc / (1 + copies_slowdown)
    else:
        cpu, copies = s + th + rc - th / (1 + cpu_slowdown), s + th
    return cpu, copies, cpu - cpu_end, copies - copies_end


@kernel
def time_forward(
    now,
    is_moe,
    rows,
    table,
    cpu_x,
    has_cpu,
    has_copies,
    ne,
    dense_s,
    result_s,
    tail_s,
    residual_s,
    after_cpu_s,
    cpu_issue_s,
    cpu_busy_gpu_s,
    cpu_slowdown,
    copies_slowdown,
    after_cpu,
    out,
):  # pragma: no cover (numba)
    """One forward starting at ``now``, its layers in model order (``is_moe``), its k-th MoE layer timed by calls
    table row ``rows[k]``, with CPU experts (``has_cpu[k]``) taking ``cpu_x[k]`` alone after the layer's gate and
    with demand copies (``has_copies[k]``). ``ne`` is a MoE layer's non-expert time, ``dense_s`` a dense layer's,
    ``tail_s`` and ``residual_s`` the forward's end; ``after_cpu``: the previous MoE layer ran a CPU call (the next
    one's bookkeeping takes ``after_cpu_s`` longer). Returns (when the forward ends, ``after_cpu`` after it) and
    adds its CPU-path terms to ``out`` (``CPU_PATH``, ``CPU_SLOWED``, ``COPIES_SLOWED``)."""
    pending = 0.0
    k = 0
    for lid in range(is_moe.shape[0]):
        if not is_moe[lid]:
            pending += dense_s
            continue
        ne_l = ne + pending
        pending = 0.0
        if after_cpu:
            ne_l += after_cpu_s
        t_gate = now + ne_l
        c = table[rows[k]]
        cpu = has_cpu[k]
        cpu_alone = t_gate + cpu_x[k] if cpu else 0.0
        after_cpu = cpu
        t_issue = t_gate + cpu_issue_s if cpu else t_gate
        landed = t_issue + c[WAIT_S] + c[COPIES_S]
        beside = cpu and has_copies[k]
        b_cpu = b_copies = b_cpu_delay = b_copies_delay = 0.0
        if beside:
            b_cpu, b_copies, b_cpu_delay, b_copies_delay = _overlapped(
                t_gate, cpu_alone, landed - c[COPIES_S], landed, cpu_slowdown, copies_slowdown
            )
            landed = b_copies
        gpu_end = _calls_end(c, t_issue, landed)
        if not cpu:
            end = gpu_end if gpu_end > t_gate else t_gate
        else:
            cpu_end = cpu_alone
            after = 0.0
            if beside:
                e = max(b_cpu, b_copies + result_s)
                after, cpu_end = e - cpu_end, e
            span, gpu_s = cpu_alone - t_gate, gpu_end - t_issue
            beside_gpu = 0.0
            if cpu_busy_gpu_s > 0 and span > 0 and gpu_s > 0:
                beside_gpu = cpu_busy_gpu_s * min(1.0, gpu_s / span)
                cpu_end = cpu_end + beside_gpu
            end = gpu_end if gpu_end > cpu_end else cpu_end
            out[CPU_PATH] += cpu_alone - t_gate
            out[CPU_PATH] += after
            out[CPU_PATH] += beside_gpu
            out[CPU_SLOWED] += b_cpu_delay
            out[COPIES_SLOWED] += b_copies_delay
        pending = end - now
        k += 1
    return now + (pending + tail_s + residual_s), after_cpu


class ExpertCallsTable:
    """The grouped GPU calls of MoE layers under one cost model, each shape computed once: by (experts, routed pairs,
    beside a CPU call) one call's (seconds issued on an idle GPU, seconds of its kernels), and by a layer's key (hits,
    their pairs, copied experts, their pairs, with CPU experts) its :class:`ExpertCalls` and a row of ``table`` (the
    columns of :func:`calls_row`) for :func:`time_forward`. A table grows as shapes come, up to ``max_shapes`` layer
    shapes: :meth:`trim`, called between forwards, then forgets them all (each entry is a pure function of its key, so
    a trim changes no result, only what is computed again). Simulations timed by the same cost model may share one
    (layers repeat the same few shapes across policies)."""

    def __init__(self, cost, max_shapes: int = 1 << 15):
        if max_shapes < 1:
            raise ValueError(f"ExpertCallsTable: max_shapes must be >= 1, got {max_shapes}")
        self.cost = cost
        self.max_shapes = max_shapes
        self._h2d_s = cost.expert_h2d_seconds()
        self._calls: dict = {}
        self._gpu: dict = {}
        self._rows: dict = {}
        self.table = np.empty((64, CALL_COLUMNS))

    def trim(self) -> None:
        """Forget every shape once more than ``max_shapes`` are held, so that a long run's table stays bounded. Call it
        only between forwards: a row number :meth:`row` gave before a trim names another shape after it."""
        if len(self._rows) > self.max_shapes or len(self._calls) > self.max_shapes:
            self._rows.clear()
            self._calls.clear()
        if len(self._gpu) > self.max_shapes:
            self._gpu.clear()

    def gpu_call(self, n: int, pairs: int, beside_cpu: bool = False) -> tuple:
        """``cost.grouped_call_seconds(n, pairs, beside_cpu)``."""
        key = (n, pairs, beside_cpu)
        v = self._gpu.get(key)
        if v is None:
            v = self._gpu[key] = self.cost.grouped_call_seconds(n, pairs, beside_cpu)
        return v

    def _gpu_call_beside_cpu(self, n: int, pairs: int) -> tuple:
        return self.gpu_call(n, pairs, True)

    def calls(self, key: tuple) -> ExpertCalls:
        """A layer's grouped calls when ``key[2]`` copied experts (``key[3]`` pairs) join ``key[0]`` hits (``key[1]``
        pairs), its CPU call running meanwhile if ``key[4]`` (``schedule.timeline.layer_expert_calls``)."""
        v = self._calls.get(key)
        if v is None:
            call = self._gpu_call_beside_cpu if key[4] else self.gpu_call
            v = self._calls[key] = layer_expert_calls(call, self._h2d_s, key[0], key[1], key[2], key[3])
        return v

    def row(self, key: tuple) -> int:
        """The row of ``table`` holding :meth:`calls` of ``key`` (a layer timed through its row keeps no
        :class:`ExpertCalls` beside it: a long run meets hundreds of thousands of shapes)."""
        r = self._rows.get(key)
        if r is None:
            r = self._rows[key] = len(self._rows)
            if r >= len(self.table):
                self.table = np.concatenate([self.table, np.empty_like(self.table)])
            calls = self._calls.get(key)
            if calls is None:
                call = self._gpu_call_beside_cpu if key[4] else self.gpu_call
                calls = layer_expert_calls(call, self._h2d_s, key[0], key[1], key[2], key[3])
            self.table[r] = calls_row(calls)
        return r
