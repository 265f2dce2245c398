"""The replay's host steps per MoE layer beside the profile's charges (``validate.host_steps``, ``dllm-report
--profile``)."""

import pandas as pd
import pytest

from dllm_offload_sim.validate.host_steps import host_steps, host_steps_table
from tests.simkit import flat_profile, tiny_topology


def _forwards():
    """Two runs of two decode forwards (and a prefill forward each) on 2 MoE layers: one copies, one runs on the CPU."""
    rows = []
    for policy, to_gpu, to_cpu in (("lru", 4, 0), ("oled", 2, 3)):
        rows.append(
            dict(
                policy=policy,
                cache=40,
                forward=0,
                phase=0,
                predicted_s=9.0,
                measured_s=9.0,
                to_gpu=99,
                to_cpu=99,
                predicted_cpu_path_s=0.0,
                measured_cpu_path_s=0.0,
                measured_bookkeeping_s=9.0,
                measured_grouped_issue_s=9.0,
                measured_grouped_calls=9,
                measured_cpu_issue_s=9.0,
                measured_copy_issue_s=9.0,
            )
        )
        for i in (1, 2):
            rows.append(
                dict(
                    policy=policy,
                    cache=40,
                    forward=i,
                    phase=1,
                    predicted_s=0.010,
                    measured_s=0.012 + i * 1e-3,
                    to_gpu=to_gpu,
                    to_cpu=to_cpu,
                    predicted_cpu_path_s=4e-3 if to_cpu else 0.0,
                    measured_cpu_path_s=5e-3 if to_cpu else 0.0,
                    measured_bookkeeping_s=1e-4 * i,
                    measured_grouped_issue_s=2e-4,
                    measured_grouped_calls=4,
                    measured_cpu_issue_s=3e-4 if to_cpu else 0.0,
                    measured_copy_issue_s=8e-5,
                )
            )
    return pd.DataFrame(rows)


def test_each_run_s_host_steps_are_its_decode_forwards_per_layer_call_and_copy():
    s = host_steps(_forwards(), n_moe_layers=2).set_index("policy")
    assert s.at["lru", "bookkeeping_us"] == pytest.approx(
        1e6 * 3e-4 / 4
    )  # 0.1 + 0.2 ms over 2 forwards x 2 layers
    assert s.at["lru", "grouped_issue_us"] == pytest.approx(50.0)  # 0.4 ms over 8 calls
    assert s.at["lru", "copy_issue_us"] == pytest.approx(20.0)  # 0.16 ms over 8 copies
    assert s.at["lru", "cpu_issue_us"] != s.at["lru", "cpu_issue_us"]  # no CPU call: NaN
    assert s.at["oled", "cpu_issue_us"] == pytest.approx(150.0)  # 0.6 ms over 4 layers
    assert s.at["lru", "gap_beyond_cpu_ms"] == pytest.approx(3.5)  # (3 + 4) / 2 ms
    assert s.at["oled", "gap_beyond_cpu_ms"] == pytest.approx(2.5)  # less the CPU path's 1 ms
    with pytest.raises(ValueError, match="no measured_copy_issue_s"):
        host_steps(_forwards().drop(columns=["measured_copy_issue_s"]), 2)


def test_the_table_puts_the_profile_s_charges_above_the_runs(tmp_path):
    prof = flat_profile(tiny_topology(n_moe=2, n_experts=8))
    prof.runtime = {"bookkeeping_s": 1.8e-5, "grouped_issue_s": 4.4e-5}
    with pytest.raises(ValueError, match="model_shape.n_moe_layers absent"):
        host_steps_table(_forwards(), prof)
    prof.model_shape["n_moe_layers"] = 2
    lines = host_steps_table(_forwards(), prof).splitlines()
    assert lines[2].startswith(
        "| the profile's charge | | 18 | 44 |  (per call)"
    )  # no CPU-call charge: empty cell
    assert lines[3] == "| lru | 40 | 75 | 50 |  | 20.0 | +3.50 |"
    assert lines[4].startswith("| oled | 40 | 75 | 50 | 150 | 40.0 |")


def test_the_report_adds_the_host_steps_given_the_profile(tmp_path, capsys):
    from dllm_offload_sim.validate.report import main as report

    d = tmp_path / "run"
    d.mkdir()
    table = pd.DataFrame(
        [
            dict(
                policy=p, cache=40, metric=m, predicted=1.0, measured=1.0, signed_rel_err=0.0, abs_rel_err=0.0
            )
            for p in ("lru", "oled")
            for m in ("tpot_ms", "prefill_ms")
        ]
    )
    table.to_parquet(d / "fidelity.parquet")
    _forwards().to_parquet(d / "fidelity_forwards.parquet")
    prof = flat_profile(tiny_topology(n_moe=2, n_experts=8))
    prof.runtime = {"bookkeeping_s": 1.8e-5}
    prof.model_shape["n_moe_layers"] = 2
    path = prof.save(tmp_path / "p.json")
    assert report([str(d), "--profile", str(path)]) == 0
    assert "### The host's steps against the profile's charges" in capsys.readouterr().out
    assert report([str(d)]) == 0
    assert "host's steps" not in capsys.readouterr().out
    assert report([str(d), "--profile", str(tmp_path / "missing.json")]) == 2
    assert "--profile" in capsys.readouterr().err
