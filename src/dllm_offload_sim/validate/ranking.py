"""Whether the simulator orders policies as the GPU does: at each (model, cache), every pair of policies whose
measured TPOT ranges (over a run's repeats) do not overlap is a pair the measurement orders; the simulator agrees
on it when its predicted TPOTs put the two the same way round. Runs replayed once have a range of one value."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pandas as pd


@dataclass(frozen=True)
class PairOrder:
    """One pair of policies at one (model, cache) that the measurement orders: ``faster`` measured faster."""

    model: str
    cache: int
    faster: str
    slower: str
    agrees: bool


@dataclass(frozen=True)
class RankingAgreement:
    """The measured-ordered pairs of a sweep and how many of them the simulator orders the same way."""

    pairs: list[PairOrder] = field(default_factory=list)

    @property
    def agree(self) -> int:
        return sum(p.agrees for p in self.pairs)

    @property
    def disagreeing(self) -> list[PairOrder]:
        return [p for p in self.pairs if not p.agrees]


def _range(r) -> tuple[float, float]:
    lo, hi = r.tpot_ms_min, r.tpot_ms_max
    return (r.tpot_ms_meas, r.tpot_ms_meas) if lo != lo or hi != hi else (lo, hi)


def ranking_agreement(runs: pd.DataFrame) -> RankingAgreement:
    """The pairs of ``runs`` (``validate.report.run_table``'s rows) whose measured TPOT ranges do not overlap, at
    each (model, cache), with whether the predicted TPOTs order them the same way."""
    runs = runs if "model" in runs else runs.assign(model="")
    pairs = []
    for (model, cache), g in runs.groupby(["model", "cache"], sort=True):
        for a, b in itertools.combinations(sorted(g.itertuples(index=False), key=lambda r: r.policy), 2):
            (alo, ahi), (blo, bhi) = _range(a), _range(b)
            if not (ahi < blo or bhi < alo):
                continue  # the repeats overlap: the measurement does not order them
            fast, slow = (a, b) if ahi < blo else (b, a)
            pairs.append(
                PairOrder(
                    str(model),
                    int(cache),
                    fast.policy,
                    slow.policy,
                    bool(fast.tpot_ms_pred < slow.tpot_ms_pred),
                )
            )
    return RankingAgreement(pairs)


def head_to_head(runs: pd.DataFrame, first: str, second: str) -> list[str]:
    """``first`` against ``second`` (TPOT, measured and simulated) at every (model, cache) where both ran: one line
    each, e.g. ``mini Cache 40: oled 68.42 vs naive_lru 76.50 ms measured (0.89x), 62.66 vs 70.16 simulated (0.89x)``."""
    runs = runs if "model" in runs else runs.assign(model="")
    out = []
    for (model, cache), g in runs.groupby(["model", "cache"], sort=True):
        m = g.set_index("policy")
        if first not in m.index or second not in m.index:
            continue
        a, b = m.loc[first], m.loc[second]
        out.append(
            f"{model + ' ' if model else ''}Cache {cache}: {first} {a.tpot_ms_meas:.2f} vs {second} "
            f"{b.tpot_ms_meas:.2f} ms measured ({a.tpot_ms_meas / b.tpot_ms_meas:.2f}x), {a.tpot_ms_pred:.2f} vs "
            f"{b.tpot_ms_pred:.2f} simulated ({a.tpot_ms_pred / b.tpot_ms_pred:.2f}x)"
        )
    return out
