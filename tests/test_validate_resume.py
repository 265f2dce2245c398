"""An interrupted validation sweep resumes: finished runs are kept under runs/, stale or partial ones redone."""

import pandas as pd
from hydra import compose, initialize_config_dir

from dllm_offload_sim.wiring.build import CONF_DIR
from dllm_offload_sim.validate.__main__ import sweep_key
from dllm_offload_sim.validate.run_store import RunStore, run_key


def _compose(*overrides):
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        return compose(config_name="validate", overrides=list(overrides))


def _rows(label, cache):
    return [{"policy": label, "cache": cache, "metric": "tpot_ms", "predicted": 1.0, "measured": 1.1}]


def test_saved_run_loads_back_under_its_key(tmp_path):
    store = RunStore(tmp_path)
    fwd = pd.DataFrame({"forward": [0, 1], "predicted_s": [0.1, 0.2], "measured_s": [0.11, 0.19]})
    store.save("oled", 40, "k1", _rows("oled", 40), fwd)
    rows, f = store.load("oled", 40, "k1")
    assert rows == _rows("oled", 40)
    pd.testing.assert_frame_equal(f, fwd)


def test_run_with_another_key_or_without_done_marker_is_redone(tmp_path):
    store = RunStore(tmp_path)
    store.save("lru", 20, "k1", _rows("lru", 20), pd.DataFrame({"forward": [0]}))
    assert store.load("lru", 20, "k2") is None  # inputs changed
    assert store.load("lru", 40, "k1") is None  # never ran
    (tmp_path / "runs" / "lru_c20" / "done.json").unlink()  # interrupted while writing
    assert store.load("lru", 20, "k1") is None


def test_sweep_key_ignores_the_run_list_but_not_the_inputs():
    a = sweep_key(_compose())
    assert a == sweep_key(_compose("validate.caches=[40]", "validate.policies=[oled]"))
    assert a == sweep_key(_compose("policy=oled", "cache=20"))
    assert a == sweep_key(
        _compose("validate.interleave=false")
    )  # the order of the replays, not what they measure
    assert a != sweep_key(_compose("validate.requests=[1]"))
    assert a != sweep_key(_compose("trace=gsm8k"))
    assert a != sweep_key(_compose("hw.pcie_gbps=32"))


def test_run_key_separates_policy_parameters_and_cache():
    k = run_key("s", "oled", {"a": 1}, 40)
    assert k != run_key("s", "oled", {"a": 2}, 40)
    assert k != run_key("s", "oled", {"a": 1}, 100)
    assert k != run_key("t", "oled", {"a": 1}, 40)
    assert k == run_key("s", "oled", {"a": 1}, 40)


def test_the_charged_decision_time_leaves_out_a_policys_one_time_warm_up(tmp_path):
    """A policy whose first decision ever takes 0.3 s (compiling its kernels) is charged its steady decision time,
    not that warm-up spread over the layers."""
    import time

    import numpy as np

    from dllm_offload_sim.policies.naive_lru import NaiveLRUPolicy
    from dllm_offload_sim.traces.reader import Trace
    from dllm_offload_sim.validate.fidelity import fidelity_rows
    from tests.simkit import flat_cost, random_request, tiny_topology, write_requests

    topo = tiny_topology(n_moe=3, n_experts=16, top_k=4).with_widths(n_group=2, topk_group=1)
    path = write_requests(tmp_path / "t", topo, [random_request(np.random.default_rng(0), 0, topo, 6, 3)])
    compiled = []

    class SlowFirstCall(NaiveLRUPolicy):
        def decide(self, view):
            if not compiled:
                compiled.append(1)
                time.sleep(0.3)
            return super().decide(view)

    rows, _, _ = fidelity_rows(
        Trace.open(path),
        SlowFirstCall,
        "slow_first",
        6,
        flat_cost(topo),
        [0],
        device="cpu",
        cpu_engine="torch",
    )
    assert compiled and rows[0]["charged_policy_us_per_layer"] < 0.3e6 / (
        6 * 3 * 3
    )  # well below the warm-up's share
