"""Ranking agreement: which pairs the measurement orders (non-overlapping repeat ranges) and whether the simulator
orders them the same way; OLED against Naive-LRU."""

import pandas as pd

from dllm_offload_sim.validate.ranking import head_to_head, ranking_agreement


def _runs(rows):
    return pd.DataFrame(
        rows,
        columns=["model", "policy", "cache", "tpot_ms_pred", "tpot_ms_meas", "tpot_ms_min", "tpot_ms_max"],
    )


def test_only_pairs_whose_measured_ranges_do_not_overlap_count_and_each_is_checked_against_the_prediction():
    runs = _runs(
        [
            ("mini", "a", 40, 10.0, 11.0, 10.5, 11.5),
            ("mini", "b", 40, 12.0, 13.0, 12.5, 13.5),  # ordered after a, and predicted so
            (
                "mini",
                "c",
                40,
                9.0,
                13.2,
                12.9,
                14.0,
            ),  # overlaps b: not ordered against it; ordered after a, predicted before
            ("mini", "a", 100, 5.0, 6.0, float("nan"), float("nan")),  # one replay: its range is its value
            ("mini", "b", 100, 6.0, 5.0, float("nan"), float("nan")),
            ("flash", "a", 40, 1.0, 1.0, 1.0, 1.0),  # another model: never compared with mini's runs
        ]
    )
    r = ranking_agreement(runs)
    pairs = {(p.model, p.cache, p.faster, p.slower): p.agrees for p in r.pairs}
    assert pairs == {
        ("mini", 40, "a", "b"): True,
        ("mini", 40, "a", "c"): False,
        ("mini", 100, "b", "a"): False,
    }
    assert r.agree == 1 and [(p.faster, p.slower) for p in r.disagreeing] == [("a", "c"), ("b", "a")]


def test_oled_against_naive_lru_is_stated_measured_and_simulated_where_both_ran():
    runs = _runs(
        [
            ("mini", "oled", 40, 62.66, 68.42, 66.0, 70.0),
            ("mini", "naive_lru", 40, 70.16, 76.50, 75.0, 79.0),
            ("mini", "oled", 100, 24.0, 28.0, 27.0, 29.0),  # no naive_lru at Cache 100: no line
        ]
    )
    assert head_to_head(runs, "oled", "naive_lru") == [
        "mini Cache 40: oled 68.42 vs naive_lru 76.50 ms measured (0.89x), 62.66 vs 70.16 simulated (0.89x)"
    ]
