"""bench/bench_sim.py's per-run timing: every policy and cache asked for, one CPU time per round."""

from __future__ import annotations

from tests.simkit import script_module


def test_per_run_times_each_policy_at_each_cache_per_round():
    runs = script_module("bench/bench_sim.py").bench_runs(["naive_lru", "lru"], rounds=2, caches=(40, 100))
    assert list(runs) == [("naive_lru", 40), ("naive_lru", 100), ("lru", 40), ("lru", 100)]
    assert all(len(s) == 2 and all(0 < x < 60 for x in s) for s in runs.values()), runs


def test_one_request_times_each_policy_asked_for():
    runs = script_module("bench/bench_sim.py").bench_one_requests(["naive_lru", "oled"], repeats=1)
    assert list(runs) == ["naive_lru", "oled"]
    assert all(0 < best <= median < 60 for best, median in runs.values()), runs
