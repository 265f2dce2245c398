"""bench/bench_cpu_engine.py's call layout: one routing slot per row (the profile's), or the replay's layout with the
other slots naming experts outside the call."""

import importlib.util
from pathlib import Path

import numpy as np


def _bench():
    spec = importlib.util.spec_from_file_location("bench_cpu_engine",
                                                  Path(__file__).parents[1] / "bench" / "bench_cpu_engine.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_routing_puts_each_rows_cpu_expert_first_and_only_outside_experts_beside_it():
    routing = _bench().routing
    experts = np.array([3, 4, 5])
    one = routing(experts, 2, 1, 8)
    assert one.shape == (6, 1) and one[:, 0].tolist() == [3, 3, 4, 4, 5, 5]
    eight = routing(experts, 2, 8, 16)
    assert eight.shape == (6, 8) and (eight[:, 0] == one[:, 0]).all()
    assert not np.isin(eight[:, 1:], experts).any()  # masked out by the engine
    assert all(len(set(row)) == 8 for row in eight.tolist())  # no expert twice in a row


def test_slots_beyond_the_models_top_k_are_refused(capsys):
    assert _bench().main(["--slots", "9", "--engines", "torch"]) == 2
    assert "--slots must be in 1..8" in capsys.readouterr().err
