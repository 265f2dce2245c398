"""bench/bench_host_work.py: the replay's host work per MoE layer, read from the validator's replay."""

import numpy as np
import pandas as pd
import pytest

from tests.simkit import flat_profile, random_request, script_module, tiny_topology, write_requests


def _bench():
    return script_module("bench/bench_host_work.py")


def test_host_work_is_the_median_decode_forward_per_moe_layer_and_per_grouped_call():
    """Prefill and unmeasured forwards are left out; per-layer columns are a forward's time over its MoE layers, and
    the grouped call's issue is per call (forwards without one left out)."""
    host_work = _bench().host_work
    rows = []
    for i, (phase, measured, host, calls) in enumerate(
        [(0, True, 9.0, 2), (1, False, 9.0, 2), (1, True, 2e-3, 4), (1, True, 4e-3, 0), (1, True, 6e-3, 2)]
    ):
        rows.append(
            dict(
                forward=i,
                phase=phase,
                measured=measured,
                host_issue_s=host,
                bookkeeping_s=host / 4,
                cpu_issue_s=0.0,
                copy_issue_s=host / 2,
                policy_s=1e-3,
                grouped_issue_s=4e-4 if calls else 0.0,
                grouped_calls=calls,
            )
        )
    out = host_work(pd.DataFrame(rows), n_moe_layers=2)
    assert out["decode_forwards"] == 3
    assert out["host_us"] == pytest.approx(2000.0) and out["bookkeeping_us"] == pytest.approx(500.0)
    assert out["copy_issue_us"] == pytest.approx(1000.0) and out["cpu_issue_us"] == 0.0
    assert out["decision_us"] == pytest.approx(500.0)
    assert out["grouped_issue_us"] == pytest.approx(150.0)  # median of 100 and 200 us per call
    with pytest.raises(ValueError, match="no measured decode forward"):
        host_work(pd.DataFrame(rows[:2]), n_moe_layers=2)


def test_the_bench_replays_each_policy_and_reads_its_cpu_calls_submission(tmp_path):
    """On the CPU device, a tiny trace: a policy that runs experts on the CPU spends host time submitting its calls,
    one that only copies spends none; every row has host work and a TPOT."""
    topo = tiny_topology(n_moe=3, n_experts=8).with_widths(n_group=2, topk_group=1)
    rng = np.random.default_rng(0)
    trace = write_requests(tmp_path / "t", topo, [random_request(rng, r, topo, 9, 3) for r in (0, 1)])
    profile = flat_profile(topo).save(tmp_path / "p.json")
    rows = _bench().bench(str(profile), str(trace), ["lru", "ktransformers"], cache=3, rounds=1, device="cpu")
    by = {r["policy"]: r for r in rows}
    assert set(by) == {"lru", "ktransformers"} and all(r["host_us"] > 0 and r["tpot_ms"] > 0 for r in rows)
    assert by["lru"]["cpu_issue_us"] == 0.0 and by["ktransformers"]["cpu_issue_us"] > 0


def test_the_profiles_charges_are_printed_beside_and_missing_terms_named(tmp_path):
    topo = tiny_topology(n_moe=1, n_experts=8)
    prof = flat_profile(topo)
    prof.runtime = {"bookkeeping_s": 3.76e-5, "cpu_issue_s": 1.409e-4}
    path = prof.save(tmp_path / "p.json")
    line = _bench().profile_line(str(path))
    assert "bookkeeping 38 us per MoE layer" in line and "a CPU call's issue 141 us" in line
    assert "a grouped call's issue not measured" in line


def test_the_bench_refuses_empty_or_invalid_settings(capsys):
    assert _bench().main(["--policies", "", "--device", "cpu"]) == 2
    assert "at least one policy" in capsys.readouterr().err


def test_the_bench_replays_each_policy_alone_and_beside_each_load(tmp_path, capsys):
    topo = tiny_topology(n_moe=3, n_experts=8).with_widths(n_group=2, topk_group=1)
    rng = np.random.default_rng(0)
    trace = write_requests(tmp_path / "t", topo, [random_request(rng, r, topo, 9, 3) for r in (0, 1)])
    profile = flat_profile(topo).save(tmp_path / "p.json")
    rows = _bench().bench(
        str(profile),
        str(trace),
        ["lru"],
        cache=3,
        rounds=1,
        device="cpu",
        beside=("none", "memory", "engine"),
        load_threads=1,
        load_mib=4,
    )
    assert [r["beside"] for r in rows] == ["none", "memory", "engine"]
    assert np.isnan(rows[0]["load_gbps"]) and rows[1]["load_gbps"] > 0 and rows[1]["host_us"] > 0
    assert (
        np.isnan(rows[1]["load_calls_per_s"]) and rows[2]["load_calls_per_s"] > 0 and rows[2]["host_us"] > 0
    )
    with pytest.raises(ValueError, match="--beside takes none, memory, engine"):
        _bench().bench(str(profile), str(trace), ["lru"], cache=3, rounds=1, device="cpu", beside=("cpu",))
    assert _bench().main(["--beside", "disk", "--device", "cpu"]) == 2
    assert "--beside takes none, memory, engine" in capsys.readouterr().err
