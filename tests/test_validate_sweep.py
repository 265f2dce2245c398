"""A validation sweep replays its runs' repeats in rounds, keeps each repeat as it finishes, and resumes from them."""

import json

import numpy as np
import pandas as pd
import pytest

from dllm_offload_sim.policies.lru import LRUPolicy
from dllm_offload_sim.policies.naive_lru import NaiveLRUPolicy
from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.validate.run_store import RunStore
from dllm_offload_sim.validate.sweep import (
    SweepRun,
    SweepSettings,
    replay_from_store,
    replay_order,
    run_sweep,
)
from tests.simkit import flat_cost, random_request, tiny_topology, write_requests


def test_replay_order_goes_round_by_round_when_interleaved():
    assert replay_order(2, 3, True) == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert replay_order(2, 3, False) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert replay_order(3, 1, True) == replay_order(3, 1, False) == [(0, 0), (1, 0), (2, 0)]


@pytest.fixture
def sweep_inputs(tmp_path):
    topo = tiny_topology(n_moe=3, n_experts=16, top_k=4).with_widths(n_group=2, topk_group=1)
    path = write_requests(tmp_path / "t", topo, [random_request(np.random.default_rng(0), 0, topo, 6, 3)])
    runs = [SweepRun("naive_lru", NaiveLRUPolicy, 6, "key-a"), SweepRun("lru", LRUPolicy, 6, "key-b")]
    return Trace.open(path), flat_cost(topo), runs


class Interrupted(Exception):
    pass


def test_an_interleaved_sweep_resumes_from_the_repeats_it_kept(tmp_path, sweep_inputs):
    """Three repeats of two runs, interrupted after each run's second repeat: the resumed sweep replays only the
    third ones, charges the decision time the first plan measured, and every run ends with three repeats."""
    trace, cost, runs = sweep_inputs
    store = RunStore(tmp_path / "out")
    settings = SweepSettings(repeats=3, interleave=True, device="cpu", cpu_engine="torch")
    seen = []

    def stop_after_second_round(r, k, rep):
        seen.append((r.label, k))
        assert np.isfinite(rep.summary["tpot_ms"]) and rep.summary["host_mem_gbps"] > 0
        if (r.label, k) == ("lru", 1):
            raise Interrupted

    with pytest.raises(Interrupted):
        run_sweep(runs, store, trace, cost, [0], settings, on_replay=stop_after_second_round)
    assert seen == [("naive_lru", 0), ("lru", 0), ("naive_lru", 1), ("lru", 1)]
    assert store.load("naive_lru", 6, "key-a") is None  # no run is complete: neither is marked done
    assert (
        len(store.load_repeats("naive_lru", 6, "key-a")) == 2
        and len(store.load_repeats("lru", 6, "key-b")) == 2
    )
    assert store.load_repeats("lru", 6, "other-key") == []  # another key's repeats are not this run's
    charge = json.loads((tmp_path / "out" / "runs" / "lru_c6" / "repeats" / "0.json").read_text())["charge"]

    seen.clear()
    completed = []
    results = run_sweep(
        runs,
        store,
        trace,
        cost,
        [0],
        settings,
        on_replay=lambda r, k, rep: seen.append((r.label, k)),
        on_run=lambda i, res, resumed: completed.append((i, resumed)),
    )
    assert seen == [("naive_lru", 2), ("lru", 2)]
    assert completed == [(0, False), (1, False)]
    for res, run in zip(results, runs):
        tpot = [x for x in res.rows if x["metric"] == "tpot_ms"][0]
        assert tpot["repeats"] == 3 and tpot["measured_min"] <= tpot["measured"] <= tpot["measured_max"]
        counters = {x["metric"]: x for x in res.rows if x["metric"] in ("hits", "demand_copies")}
        assert all(
            x["predicted"] == x["measured"] for x in counters.values()
        )  # the schedule the repeats followed
        assert store.load(run.label, run.cache, run.key) is not None
    lru_tpot = [x for x in results[1].rows if x["metric"] == "tpot_ms"][0]
    assert [lru_tpot["simulated_policy_us_per_layer"], lru_tpot["charged_policy_us_per_layer"]] == charge

    from dllm_offload_sim.validate.__main__ import round_line, run_line

    line = run_line(2, 2, "lru", 6, results[1].rows, False)
    assert line.startswith("[2/2] lru") and "3 repeats" in line and "decisions charged" in line
    assert run_line(1, 2, "lru", 6, results[1].rows, True).endswith("[resumed]")
    rep = replay_from_store(*store.load_repeats("lru", 6, "key-b")[2])
    assert round_line("lru", 6, 2, 3, rep).startswith("  round 3/3: lru")

    # a third sweep finds every run done and replays nothing
    seen.clear()
    completed.clear()
    again = run_sweep(
        runs,
        store,
        trace,
        cost,
        [0],
        settings,
        on_replay=lambda r, k, rep: seen.append((r.label, k)),
        on_run=lambda i, res, resumed: completed.append((i, resumed)),
    )
    assert seen == [] and completed == [(0, True), (1, True)]
    assert [x["measured"] for x in again[1].rows] == [x["measured"] for x in results[1].rows]


def test_a_back_to_back_sweep_replays_run_by_run(tmp_path, sweep_inputs):
    trace, cost, runs = sweep_inputs
    seen = []
    run_sweep(
        runs,
        RunStore(tmp_path / "out"),
        trace,
        cost,
        [0],
        SweepSettings(repeats=2, interleave=False, device="cpu", cpu_engine="torch"),
        on_replay=lambda r, k, rep: seen.append((r.label, k)),
    )
    assert seen == [("naive_lru", 0), ("naive_lru", 1), ("lru", 0), ("lru", 1)]
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        run_sweep(runs, RunStore(tmp_path / "out2"), trace, cost, [0], SweepSettings(repeats=0, device="cpu"))


def test_a_sweep_split_over_calls_finds_the_runs_an_earlier_call_finished(tmp_path, sweep_inputs):
    """A sweep split by cache over two calls into one directory: the second call's table can hold the first call's
    runs, those its keys name, and only those."""
    from dllm_offload_sim.validate.sweep import earlier_runs

    trace, cost, runs = sweep_inputs
    store = RunStore(tmp_path / "out")
    settings = SweepSettings(repeats=1, device="cpu", cpu_engine="torch")
    first = run_sweep(runs[:1], store, trace, cost, [0], settings)  # the first call: naive_lru
    keys = {("naive_lru", 6): "key-a", ("lru", 6): "key-b"}
    found = earlier_runs(store, runs[1:], lambda label, cache: keys.get((label, cache)))
    assert [(e.label, e.cache) for e in found] == [("naive_lru", 6)]
    pd.testing.assert_frame_equal(pd.DataFrame(found[0].result.rows), pd.DataFrame(first[0].rows))
    assert found[0].result.layers is None
    assert (
        earlier_runs(store, runs, lambda label, cache: keys.get((label, cache))) == []
    )  # all of them run here
    assert earlier_runs(store, runs[1:], lambda label, cache: "another-config") == []
