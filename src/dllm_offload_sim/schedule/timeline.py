"""A MoE layer's timeline: when its grouped GPU calls end and how long its CPU experts take.

One function answers both questions for the simulator's closed form (nothing else can interleave with the
layer) and for its event path (copies land whenever the copy engine delivers them), and the GPU replay takes the
same rule to decide how it issues a layer's calls (:func:`layer_expert_calls`, :func:`expert_calls_together`).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass


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
