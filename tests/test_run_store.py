"""The run store of a validation sweep: finished runs kept under their keys, and found again by the sweep they
belong to."""

import pandas as pd

from dllm_offload_sim.validate.run_store import RunStore


def test_the_runs_of_a_sweep_are_the_finished_runs_its_keys_name(tmp_path):
    store = RunStore(tmp_path)
    for label, cache, key in (("oled", 20, "a"), ("oled", 40, "b"), ("lru", 20, "x"), ("lfu", 20, "c")):
        store.save(
            label,
            cache,
            key,
            [{"metric": "tpot_ms", "policy": label, "cache": cache}],
            pd.DataFrame({"forward": [0]}),
        )
    (tmp_path / "runs" / "lfu_c20" / "done.json").unlink()  # cut off before it finished
    keys = {("oled", 20): "a", ("oled", 40): "b", ("lru", 20): "y", ("lfu", 20): "c"}
    got = store.runs_of_sweep(lambda label, cache: keys.get((label, cache)))
    assert got == [("oled", 20, "a"), ("oled", 40, "b")]  # lru ran under another config; lfu never finished
    assert store.runs_of_sweep(lambda label, cache: None) == []  # runs of policies the sweep cannot have
    rows, fwd = store.load("oled", 40, "b")
    assert rows == [{"metric": "tpot_ms", "policy": "oled", "cache": 40}] and list(fwd.forward) == [0]
