"""How far a trace's decoding behaviour is from LLaDA2.0's, on the three behaviours OLED-MoE's design rests on.

* tokens decoded per forward at threshold 0.9 (dInfer decodes 2.55 with LLaDA2.0-mini, block 16);
* block-boundary overlap (the paper measures more than 0.65);
* confident tokens keep their routes (the paper's Fig. 10a): the route-kept rate of masked tokens with confidence
  >= 0.9 above that of tokens below 0.5.

Each behaviour's gap is 0 where the trace behaves as the paper measured and grows with the distance: the relative
distance from 2.55 tokens per forward, the relative shortfall below 0.65 overlap, and how far the confident tokens'
route-kept rate falls below the unconfident ones'. A trace the analytics could not measure a behaviour on (no token
that confident) is infinitely far on it. ``compare`` says which of two traces is closer on each behaviour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TOKENS_PER_FORWARD = 2.55  # dInfer, LLaDA2.0-mini, block 16, threshold 0.9 (OLED-MoE paper)
BOUNDARY_OVERLAP = 0.65  # OLED-MoE paper §3.3: more than this across a block boundary


@dataclass(frozen=True)
class BehaviourGaps:
    """A trace's distance from LLaDA2.0's behaviour on each of the three behaviours (0 = as the paper measured)."""

    tokens_per_forward: float
    boundary_overlap: float
    confident_routes_kept: float

    NAMES = ("tokens_per_forward", "boundary_overlap", "confident_routes_kept")

    @classmethod
    def of(cls, summary: dict) -> "BehaviourGaps":
        """The gaps of a trace's analytics summary (``traces.analytics.compute_stats(...).summary``)."""

        def finite(x):
            return x is not None and math.isfinite(float(x))

        tpf, bo = summary.get("tokens_per_forward"), summary.get("boundary_overlap")
        hi, lo = summary.get("stability_conf_0.9_up"), summary.get("stability_conf_below_0.5")
        return cls(
            tokens_per_forward=abs(tpf - TOKENS_PER_FORWARD) / TOKENS_PER_FORWARD
            if finite(tpf)
            else math.inf,
            boundary_overlap=max(0.0, BOUNDARY_OVERLAP - bo) / BOUNDARY_OVERLAP if finite(bo) else math.inf,
            confident_routes_kept=max(0.0, lo - hi) if finite(hi) and finite(lo) else math.inf,
        )

    def as_dict(self) -> dict:
        return {n: getattr(self, n) for n in self.NAMES}


def compare(a: BehaviourGaps, b: BehaviourGaps) -> dict:
    """Per behaviour, which trace is closer to LLaDA2.0 ("a", "b" or "tie"), and how many each is closer on."""
    per = {}
    for n in BehaviourGaps.NAMES:
        x, y = getattr(a, n), getattr(b, n)
        per[n] = "tie" if x == y else ("a" if x < y else "b")
    return {
        "per_behaviour": per,
        "a_closer_on": sum(v == "a" for v in per.values()),
        "b_closer_on": sum(v == "b" for v in per.values()),
    }


def format_gaps(names: list[str], summaries: list[dict]) -> str:
    """The gaps of several traces side by side; the first trace's comparison with each other one below."""
    gaps = [BehaviourGaps.of(s) for s in summaries]
    w = max(14, *(len(n) for n in names))
    lines = [
        "distance from LLaDA2.0's behaviour (0 = as the paper measured)",
        f"{'behaviour':34s} " + " ".join(f"{n:>{w}s}" for n in names),
    ]
    for n in BehaviourGaps.NAMES:
        lines.append(f"{n:34s} " + " ".join(f"{getattr(g, n):>{w}.3f}" for g in gaps))
    for name, g in zip(names[1:], gaps[1:]):
        c = compare(gaps[0], g)
        lines.append(
            f"{names[0]} is closer than {name} on {c['a_closer_on']} of 3 behaviours, "
            f"farther on {c['b_closer_on']}"
        )
    return "\n".join(lines)
