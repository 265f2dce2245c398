"""A MoE layer's timeline: when its grouped GPU calls end, how long its CPU experts take, and when the layer ends.

One function times a layer once its demand copies have landed (:func:`layer_span`), for the simulator's closed form
(nothing else can interleave with the layer: the copies land as on an idle copy engine) and for its event path
(copies land whenever the copy engine delivers them). The GPU replay takes the same rule to decide how it issues a
layer's calls (:func:`layer_expert_calls`, :func:`expert_calls_together`).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Protocol


def cpu_makespan(costs: list[float], workers: int) -> float:
    """Finish time of jobs list-scheduled in order on ``workers`` identical workers."""
    if workers <= 1 or len(costs) <= 1:
        return float(sum(costs))
    free = [0.0] * min(workers, len(costs))
    for c in costs:
        t = heapq.heappop(free)
        heapq.heappush(free, t + c)
    return max(free)


def copies_after_hits_s(hit: tuple) -> float:
    """How long a layer's demand copies wait when the hits' call is issued first: its host part."""
    return hit[0] - hit[1]


def expert_calls_end(
    t0: float, arrive: float, together: bool, hit: tuple, copied: tuple, both: tuple
) -> float:
    """When a layer's grouped GPU calls end if the host starts issuing them at ``t0`` and the demand
    copies land at ``arrive``. Each call is (seconds when issued with the GPU idle, seconds of its kernels
    alone): a call waiting for copies is issued ahead of them (its host part overlaps them) and only
    its kernels wait."""
    if together:
        all_s, all_dev = both
        return max(t0 + all_s - all_dev, arrive) + all_dev
    hit_s, hit_dev = hit
    g_s, g_dev = copied
    return max(t0 + hit_s, t0 + (hit_s - hit_dev) + (g_s - g_dev), arrive) + g_dev


def expert_calls_together(copies_s: float, hit: tuple, copied: tuple, both: tuple) -> bool:
    """Whether one grouped call over hits and copies ends sooner than a call over the hits followed by
    one over the copies, when the copies take ``copies_s`` on an idle copy engine. One call: the copies
    are issued first and the call waits for them. Two calls: the hits' call is issued first (its kernels
    run while the copies land), then the copies, then the copies' call."""
    return expert_calls_end(0.0, copies_s, True, hit, copied, both) < expert_calls_end(
        0.0, copies_after_hits_s(hit) + copies_s, False, hit, copied, both
    )


@dataclass(frozen=True, slots=True)
class ExpertCalls:
    """How one MoE layer's expert work runs on the GPU: the hits' call, and the copied experts' call (or one
    call over both) once the demand copies land. Each call is (seconds issued on an idle GPU, seconds of its
    kernels alone)."""

    hit: tuple
    copied: tuple | None = None  # None: nothing is copied
    both: tuple | None = None
    copies_s: float = 0.0  # the demand copies on an idle copy engine
    together: bool = False  # one call over hits and copies (expert_calls_together)
    copies_wait_s: float = 0.0  # the copies are issued after the hits' call's host part

    @classmethod
    def plan(cls, hit: tuple, copied: tuple, both: tuple, copies_s: float) -> "ExpertCalls":
        together = expert_calls_together(copies_s, hit, copied, both)
        return cls(hit, copied, both, copies_s, together, 0.0 if together else copies_after_hits_s(hit))

    def copies_land_when_idle(self, t_issue: float) -> float:
        """When the copies land if the copy engine is idle when the host issues the layer at ``t_issue``."""
        return t_issue + self.copies_wait_s + self.copies_s

    def end(self, t_issue: float, arrive: float) -> float:
        """When the layer's GPU expert work ends, issued at ``t_issue``, its copies landing at ``arrive``."""
        if self.copied is None:
            return t_issue + self.hit[0]
        return expert_calls_end(t_issue, arrive, self.together, self.hit, self.copied, self.both)


def layer_expert_calls(call, h2d_s: float, n_hits: int, hit_tok: int, n_gpu: int, g_tok: int) -> ExpertCalls:
    """A MoE layer's grouped calls when ``n_gpu`` copied experts (``g_tok`` pairs) join ``n_hits`` hits (``hit_tok``
    pairs): ``call(n, pairs)`` gives a grouped call's (seconds issued on an idle GPU, seconds of its kernels), ``h2d_s``
    one expert's copy. The simulator times a layer with it and the GPU replay issues the layer's calls by its rule."""
    hit = call(n_hits, hit_tok)
    if not n_gpu:
        return ExpertCalls(hit)
    return ExpertCalls.plan(hit, call(n_gpu, g_tok), call(n_hits + n_gpu, hit_tok + g_tok), n_gpu * h2d_s)


class CopiesBesideCpu(Protocol):
    """When a layer's CPU call and its demand copies end, each slowed while the other ran beside it, and how much
    later than alone each ends (``costmodel.contention.OverlapEnds``)."""

    cpu_end_s: float
    copies_end_s: float
    cpu_delay_s: float
    copies_delay_s: float


@dataclass(frozen=True, slots=True)
class LayerSpan:
    """When one MoE layer's paths end, on the run's clock, and what its CPU path was charged.

    ``cpu_end_s`` is when the CPU experts' result is on the GPU (the gate's time without CPU experts) and
    ``cpu_computed_s`` when the CPU call computed (NaN without one); ``end_s`` joins the two paths. A forward's CPU-path
    time grows by ``cpu_compute_s``, ``cpu_after_copies_s`` and ``cpu_beside_gpu_s``, added in that order."""

    gpu_end_s: float
    cpu_end_s: float
    cpu_computed_s: float
    end_s: float
    cpu_compute_s: float = 0.0  # the CPU call alone: dispatch and its experts on the workers
    cpu_after_copies_s: float = (
        0.0  # later because the demand copies ran beside it and its result queued behind them
    )
    cpu_beside_gpu_s: float = 0.0  # later because the GPU worked beside it
    cpu_slowed_s: float = 0.0  # how much later the CPU call computed because demand copies ran beside it
    copies_slowed_s: float = (
        0.0  # how much later the demand copies landed because the CPU call ran beside them
    )


def layer_span(
    calls: ExpertCalls,
    t_gate: float,
    t_issue: float,
    landed: float,
    cpu_alone_end: float | None = None,
    beside: CopiesBesideCpu | None = None,
    result_s: float = 0.0,
    cpu_busy_gpu_s: float = 0.0,
) -> LayerSpan:
    """A MoE layer's times whose activations were ready at ``t_gate``, whose GPU path the host issued at ``t_issue``
    and whose demand copies landed at ``landed`` (ignored without copies).

    With CPU experts, ``cpu_alone_end`` is when their call would be done alone. Beside the layer's demand copies
    (``beside``: both ends, each slowed by the other) their result's copy (``result_s``) queues behind the copies.
    While the GPU path runs beside the call's compute, the call is later by ``cpu_busy_gpu_s`` times the share of its
    compute the GPU path covers: a call the GPU works beside for its whole length pays it once."""
    gpu_end = calls.end(t_issue, landed)
    if cpu_alone_end is None:
        return LayerSpan(gpu_end, t_gate, float("nan"), gpu_end if gpu_end > t_gate else t_gate)
    cpu_end = computed = cpu_alone_end
    after = slowed = copies_slowed = beside_gpu = 0.0
    if beside is not None:
        computed = beside.cpu_end_s
        end = max(beside.cpu_end_s, beside.copies_end_s + result_s)
        after, cpu_end = end - cpu_end, end
        slowed, copies_slowed = beside.cpu_delay_s, beside.copies_delay_s
    span, gpu_s = cpu_alone_end - t_gate, gpu_end - t_issue
    if cpu_busy_gpu_s > 0 and span > 0 and gpu_s > 0:
        beside_gpu = cpu_busy_gpu_s * min(1.0, gpu_s / span)
        cpu_end = cpu_end + beside_gpu
    return LayerSpan(
        gpu_end,
        cpu_end,
        computed,
        gpu_end if gpu_end > cpu_end else cpu_end,
        cpu_alone_end - t_gate,
        after,
        beside_gpu,
        slowed,
        copies_slowed,
    )
