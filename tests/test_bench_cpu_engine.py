"""bench/bench_cpu_engine.py's call layout: one routing slot per row (the profile's), or the replay's layout with the
other slots naming experts outside the call."""

import numpy as np

from tests.simkit import script_module


def _bench():
    return script_module("bench/bench_cpu_engine.py")


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


def test_the_report_prints_each_engines_call_beside_the_layers_gpu_work(capsys):
    """A GPU run's "beside the layer's GPU work" rows: the CPU path alone, with copies and with compute after it, and
    what each adds (us)."""
    r = {
        "model": "m",
        "device": "cuda",
        "threads": 14,
        "kt_variant": "amx",
        "stream_gbps": 90.0,
        "max_tokens": 960,
        "host_inputs": False,
        "idle_s": 2e-3,
        "slots": 8,
        "points": [],
        "host_work": {"engine": "kt-stream", "asleep_s": 1e-3, "after_call_s": 1e-3},
        "beside_gpu_work": [
            {
                "engine": "kt-stream",
                "experts": 8,
                "tokens_per_expert": 4,
                "copies": 8,
                "matmuls": 7,
                "matmul_s": 2e-4,
                "path_alone_s": 1.0e-3,
                "path_copies_s": 1.2e-3,
                "path_compute_s": 1.25e-3,
                "path_alone_range_s": [0.9e-3, 1.1e-3],
                "path_copies_range_s": [1.1e-3, 1.3e-3],
                "path_compute_range_s": [1.2e-3, 1.3e-3],
            }
        ],
    }
    _bench().report(r)
    line = next(
        x for x in capsys.readouterr().out.splitlines() if x.startswith("beside the layer's GPU work")
    )
    assert "(kt-stream, 8 x 4): CPU path 1.000 ms alone (0.900-1.100)" in line
    assert "1.200 ms with 8 copies after it (1.100-1.300; +200 us)" in line
    assert "1.250 ms with 7 GPU matmuls after it (1.200-1.300; +250 us)" in line
