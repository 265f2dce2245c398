"""The paper's numeric claims (abstract, §3, §4.3, §5), each with how the project computes it from one rung's runs and
how a value is judged against the paper's.

Verdicts (:func:`verdict`): ``reproduced`` where every number is within the tolerance of the paper's (a ratio within
20% of it, a percentage within 5 points, inside a stated band, a bound met), ``direction holds`` where each number points the paper's way
(OLED faster, utilisation higher, a positive correlation) but some number is outside the tolerance, ``partly`` where
the direction holds for some numbers only, ``not reproduced`` where it holds for none. ``n/a`` where the rung has no
runs of the model the claim is about.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from dllm_offload_sim.reproduce.setups import BASELINES, GAP_CACHES, LADDER

RATIO_TOL = 0.20  # a ratio claim is reproduced within 20% of the paper's
POINTS_TOL = 5.0  # a percentage claim within 5 percentage points


@dataclass
class RungResults:
    """One rung's runs (one row per model, policy, cache) and its traces' statistics (per model)."""

    table: pd.DataFrame
    stats: dict  # model -> traces.analytics summary dict

    def value(self, model: str, policy: str, cache: int, col: str = "tpot_ms") -> float:
        t = self.table
        r = t[(t.model == model) & (t.policy == policy) & (t.cache == cache)]
        if policy == "full_residency" and r.empty:
            r = t[(t.model == model) & (t.policy == policy)]
        return float(r[col].iloc[0]) if len(r) else math.nan

    def models(self) -> list[str]:
        return sorted(set(self.table.model))

    def caches(self) -> list[int]:
        return sorted(set(self.table[self.table.policy == "naive_lru"].cache))

    def cells(self) -> list[tuple[str, int]]:
        return [(m, c) for m in self.models() for c in self.caches()]

    def strongest(self, model: str, cache: int) -> str:
        """The baseline with the lowest TPOT at (model, cache)."""
        return min(BASELINES, key=lambda b: self.value(model, b, cache))


@dataclass(frozen=True)
class Claim:
    """A numeric claim: the paper's numbers and how ours are computed and judged."""

    id: str
    section: str
    text: str
    paper: str  # as the paper states it
    paper_values: tuple  # its numbers, in the order ``compute`` returns ours
    kind: str  # ratio (x, direction: > 1) | reduction (%, direction: > 0) | level (%, no direction) | bound | sign
    compute: Callable[[RungResults], tuple]
    fmt: str = "{:.2f}"  # one number of ours
    unit: str = ""

    def show(self, values) -> str:
        if values is None or all(_nan(v) for v in values):
            return "n/a"
        return " / ".join("n/a" if _nan(v) else self.fmt.format(v) + self.unit for v in values)


def _nan(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def verdict(claim: Claim, ours) -> str:
    """``reproduced``, ``direction holds``, ``partly``, ``not reproduced`` or ``n/a`` (module docstring)."""
    if ours is None or any(_nan(v) for v in ours):
        return "n/a"
    pairs = list(zip(claim.paper_values, ours))
    k = claim.kind
    if k == "ratio":
        close = [abs(o / p - 1) <= RATIO_TOL for p, o in pairs]
        way = [o > 1 for _, o in pairs]
    elif k == "reduction":
        close = [abs(o - p) <= POINTS_TOL for p, o in pairs]
        way = [o > 0 for _, o in pairs]
    elif k == "level":
        close = [abs(o - p) <= POINTS_TOL for p, o in pairs]
        way = close
    elif (
        k == "band"
    ):  # ours inside the paper's [low, high]; near it (within the tolerance) counts as the direction
        (lo, hi), (o,) = claim.paper_values, ours
        close, way = [lo <= o <= hi], [lo - POINTS_TOL <= o <= hi + POINTS_TOL]
    elif k == "gap":  # a gap above a bound: its direction is OLED at or above the bound
        close = [abs(o - p) <= POINTS_TOL for p, o in pairs]
        way = [o >= 0 for _, o in pairs]
    elif k == "bound":  # ours must reach the paper's lower bound
        close = [o >= p for p, o in pairs]
        way = close
    elif k == "sign":
        close = way = [o > 0 for _, o in pairs]
    elif k == "util_pair":  # (baseline, OLED) utilisation: OLED above the baseline is the direction
        close = [abs(o - p) <= POINTS_TOL for p, o in pairs]
        way = [ours[1] > ours[0]]
    else:
        raise ValueError(f"claim {claim.id}: unknown kind {k!r}")
    if all(close):
        return "reproduced"
    if all(way):
        return "direction holds"
    return "partly" if any(way) else "not reproduced"


# ---------------------------------------------------------------------------------------------- computations
def _ratios_vs_baselines(r: RungResults, col: str, oled_over: bool) -> list[float]:
    out = []
    for m, c in r.cells():
        o = r.value(m, "oled", c, col)
        for b in BASELINES:
            v = r.value(m, b, c, col)
            out.append(o / v if oled_over else v / o)
    return out


def tpot_vs_systems(r):
    x = _ratios_vs_baselines(r, "tpot_ms", oled_over=False)
    return (min(x), max(x)) if x else None


def util_vs_systems(r):
    x = _ratios_vs_baselines(r, "cache_util", oled_over=True)
    return (min(x), max(x)) if x else None


def _over_strongest(r, model=None):
    return [
        r.value(m, r.strongest(m, c), c) / r.value(m, "oled", c) for m, c in r.cells() if model in (None, m)
    ]


def strongest_mean_max(r):
    x = _over_strongest(r)
    return (float(np.mean(x)), max(x)) if x else None


def strongest_util(r):
    b = [r.value(m, r.strongest(m, c), c, "cache_util") for m, c in r.cells()]
    o = [r.value(m, "oled", c, "cache_util") for m, c in r.cells()]
    return (100 * float(np.mean(b)), 100 * float(np.mean(o))) if b else None


def flash_and_mini(r):
    return tuple(
        float(np.mean(x)) if x else math.nan
        for x in (_over_strongest(r, "flash"), _over_strongest(r, "mini"))
    )


def gap_to_bound(r):
    gaps = [
        100 * (r.value(m, "oled", c) / r.value(m, "belady", c) - 1) for m in r.models() for c in GAP_CACHES
    ]
    gaps = [g for g in gaps if not math.isnan(g)]
    return (min(gaps), max(gaps)) if gaps else None


def ablation_steps(r):
    steps = [
        [100 * (1 - r.value(m, LADDER[i + 1], c) / r.value(m, LADDER[i], c)) for i in range(3)]
        for m, c in r.cells()
    ]
    return tuple(float(v) for v in np.mean(steps, axis=0)) if steps else None


def _vs_lru(r, m, c):
    return 100 * (1 - r.value(m, "oled", c) / r.value(m, "naive_lru", c))


def vs_lru_at(cache):
    def f(r):
        x = [_vs_lru(r, m, cache) for m in r.models()]
        return (float(np.mean(x)),) if x and cache in r.caches() else None

    return f


def vs_lru_models(r):
    return tuple(
        float(np.mean([_vs_lru(r, m, c) for c in r.caches()])) if m in r.models() else math.nan
        for m in ("flash", "mini")
    )


def above_full(model):
    def f(r):
        if model not in r.models() or 100 not in r.caches():
            return None
        return (100 * (r.value(model, "oled", 100) / r.value(model, "full_residency", 100) - 1),)

    return f


def trace_stat(key, scale=1.0, model="mini"):
    def f(r):
        s = r.stats.get(model)
        return (scale * float(s[key]),) if s else None

    return f


def active_experts(r):
    return tuple(
        float(r.stats[m]["distinct_experts_per_layer"]) if m in r.stats else math.nan
        for m in ("mini", "flash")
    )


CLAIMS = [
    Claim(
        "tpot_vs_systems",
        "abstract, §5.2",
        "TPOT reduction over MoE-Infinity, FineMoE, KTransformers (min-max)",
        "1.23x-7.93x",
        (1.23, 7.93),
        "ratio",
        tpot_vs_systems,
        unit="x",
    ),
    Claim(
        "util_vs_systems",
        "abstract",
        "expert-cache utilisation over the same systems (min-max)",
        "1.44x-4.23x",
        (1.44, 4.23),
        "ratio",
        util_vs_systems,
        unit="x",
    ),
    Claim(
        "over_strongest",
        "§5.2",
        "TPOT reduction over the strongest baseline (mean / max)",
        "1.95x / 3.73x",
        (1.95, 3.73),
        "ratio",
        strongest_mean_max,
        unit="x",
    ),
    Claim(
        "util_strongest",
        "§5.2",
        "cache utilisation, strongest baseline -> OLED (means)",
        "51.5% -> 77.7%",
        (51.5, 77.7),
        "util_pair",
        strongest_util,
        fmt="{:.1f}",
        unit="%",
    ),
    Claim(
        "flash_mini",
        "§5.2",
        "mean TPOT reduction over the strongest baseline, flash / mini",
        "4.55x / 1.64x",
        (4.55, 1.64),
        "ratio",
        flash_and_mini,
        unit="x",
    ),
    Claim(
        "gap_to_bound",
        "§5.2, Fig. 13",
        "OLED TPOT above the ideal cache bound (belady), Cache 20-100 (min-max)",
        "1.93%-15.22%",
        (1.93, 15.22),
        "gap",
        gap_to_bound,
        fmt="{:+.1f}",
        unit="%",
    ),
    Claim(
        "ablation",
        "§5.3, Fig. 15a",
        "TPOT reduction of +Priority / +LayerAdapt / +Coop (means)",
        "20.56% / 9.09% / 9.14%",
        (20.56, 9.09, 9.14),
        "reduction",
        ablation_steps,
        fmt="{:.1f}",
        unit="%",
    ),
    Claim(
        "vs_lru_40",
        "§5.3",
        "full system vs Naive-LRU at Cache 40 (TPOT reduction, mean over models)",
        "53.7%",
        (53.7,),
        "reduction",
        vs_lru_at(40),
        fmt="{:.1f}",
        unit="%",
    ),
    Claim(
        "vs_lru_100",
        "§5.3",
        "full system vs Naive-LRU at Cache 100",
        "34.5%",
        (34.5,),
        "reduction",
        vs_lru_at(100),
        fmt="{:.1f}",
        unit="%",
    ),
    Claim(
        "vs_lru_models",
        "§5.3",
        "full system vs Naive-LRU, flash / mini (mean over caches)",
        "50.5% / 37.8%",
        (50.5, 37.8),
        "reduction",
        vs_lru_models,
        fmt="{:.1f}",
        unit="%",
    ),
    Claim(
        "above_full_mini",
        "abstract, §5.4",
        "OLED at Cache 100 above full residency, mini",
        "32%",
        (32.0,),
        "level",
        above_full("mini"),
        fmt="{:+.0f}",
        unit="%",
    ),
    Claim(
        "above_full_flash",
        "abstract, §5.4",
        "OLED at Cache 100 above full residency, flash",
        "23%",
        (23.0,),
        "level",
        above_full("flash"),
        fmt="{:+.0f}",
        unit="%",
    ),
    Claim(
        "adjacent_overlap",
        "§3.3",
        "same-layer expert overlap of adjacent iterations (mini)",
        "85%-90%",
        (85.0, 90.0),
        "band",
        trace_stat("adjacent_overlap", 100),
        fmt="{:.1f}",
        unit="%",
    ),
    Claim(
        "boundary_overlap",
        "§3.3",
        "overlap across a block boundary (mini)",
        "> 65%",
        (65.0,),
        "bound",
        trace_stat("boundary_overlap", 100),
        fmt="{:.1f}",
        unit="%",
    ),
    Claim(
        "active_experts",
        "§5.2, Fig. 10c",
        "activated experts per MoE layer per iteration, mini / flash",
        "about 60 / 90",
        (60.0, 90.0),
        "ratio",
        active_experts,
        fmt="{:.0f}",
    ),
    Claim(
        "footprint",
        "§3.1",
        "active expert set of a block-16 iteration over one token's (mini)",
        "up to about 8x",
        (8.0,),
        "ratio",
        trace_stat("footprint_ratio_vs_token"),
        fmt="{:.1f}",
        unit="x",
    ),
    Claim(
        "confidence_premise",
        "§4.3, Fig. 10a",
        "token confidence vs routing stability (correlation, mini)",
        "strongly positive",
        (1.0,),
        "sign",
        trace_stat("conf_stability_corr"),
        fmt="{:+.2f}",
    ),
]


def evaluate(r: RungResults) -> dict[str, tuple | None]:
    """Every claim's values on one rung."""
    out = {}
    for c in CLAIMS:
        try:
            v = c.compute(r)
        except (KeyError, IndexError, ValueError):
            v = None
        out[c.id] = None if v is None else tuple(float(x) for x in v)
    return out
