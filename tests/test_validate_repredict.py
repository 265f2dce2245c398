"""Re-predicting validated runs offline: the same profile gives the stored predictions back; a changed
profile moves the prediction, not the measurement; cost-driven policies keep their validated decisions
with ``--decide-with``."""

import json

import numpy as np
import pandas as pd
import pytest

from tests.simkit import flat_profile, random_request, tiny_topology, write_requests


@pytest.fixture
def run_dir(tmp_path):
    """A validate run directory from the CPU replay: OLED and Naive-LRU at cache 3, its profile file."""
    from omegaconf import OmegaConf

    from dllm_offload_sim.costmodel import CostModel
    from dllm_offload_sim.policies.naive_lru import NaiveLRUPolicy
    from dllm_offload_sim.policies.oled import OLEDPolicy
    from dllm_offload_sim.traces.reader import Trace
    from dllm_offload_sim.validate.fidelity import fidelity_rows
    from dllm_offload_sim.validate.run_store import RunStore

    topo = tiny_topology(n_moe=3, n_experts=8).with_widths(n_group=2, topk_group=1)
    trace = write_requests(tmp_path / "t", topo, [random_request(np.random.default_rng(2), 0, topo, 8, 3)])
    prof = tmp_path / "profile.json"
    flat_profile(topo).save(prof)
    store = RunStore(tmp_path / "run")
    for label, make in (("oled", OLEDPolicy), ("naive_lru", NaiveLRUPolicy)):
        rows, fwd, _ = fidelity_rows(
            Trace.open(trace), make, label, 3, CostModel(str(prof)), [0], device="cpu"
        )
        store.save(label, 3, "k", rows, fwd)
    (tmp_path / "run" / ".hydra").mkdir()
    OmegaConf.save(
        OmegaConf.create(
            {"trace": {"path": str(trace)}, "validate": {"requests": [0]}, "hw": {"cpu_workers": 1}}
        ),
        tmp_path / "run" / ".hydra" / "config.yaml",
    )
    return tmp_path / "run", prof


def _tpot(table, policy):
    return table[(table.policy == policy) & (table.metric == "tpot_ms")].iloc[0]


def test_the_runs_own_profile_gives_the_stored_predictions_back(run_dir, tmp_path):
    from dllm_offload_sim.validate.repredict import main
    from dllm_offload_sim.validate.run_store import RunStore

    d, prof = run_dir
    assert main([str(d), "--profile", str(prof), "--out", str(tmp_path / "same.parquet")]) == 0
    new, old = pd.read_parquet(tmp_path / "same.parquet"), RunStore(d).finished_rows()
    pd.testing.assert_frame_equal(
        new.sort_values(["policy", "metric"]).reset_index(drop=True),
        old.sort_values(["policy", "metric"]).reset_index(drop=True),
    )


def test_a_changed_field_moves_the_prediction_not_the_measurement(run_dir, tmp_path):
    from dllm_offload_sim.validate.repredict import main
    from dllm_offload_sim.validate.run_store import RunStore

    d, prof = run_dir
    assert (
        main(
            [
                str(d),
                "--profile",
                str(prof),
                "--set",
                "runtime.bookkeeping_s=1e-3",
                "--out",
                str(tmp_path / "w.csv"),
            ]
        )
        == 0
    )
    new, old = pd.read_csv(tmp_path / "w.csv"), RunStore(d).finished_rows()
    for pol in ("oled", "naive_lru"):
        a, b = _tpot(old, pol), _tpot(new, pol)
        assert b.measured == a.measured and b.predicted > a.predicted  # 1 ms more per MoE layer
        assert b.signed_rel_err == pytest.approx((b.predicted - b.measured) / b.measured)
    counters = new[new.metric.isin(["hits", "demand_copies", "cpu_experts"])]
    assert (counters.predicted == counters.measured).all()
    launch = new[new.metric == "host_launch_us"]
    assert (
        launch.predicted.isna().all() and (launch.measured > 0).all()
    )  # the test profile has no launch stamp
    mem = new[new.metric == "host_mem_gbps"]  # nor host memory probes; the runs' own probes are kept
    assert len(mem) == 2 and mem.predicted.isna().all() and (mem.measured > 0).all()


def test_decisions_follow_the_run_profile_with_decide_with(run_dir, tmp_path):
    """OLED splits misses by the profile's costs: under a much faster CPU it decides differently, unless it
    decides with the run's own profile (then only the timing changes)."""
    from dllm_offload_sim.validate.repredict import main

    d, prof = run_dir
    fast_cpu = tmp_path / "fast_cpu.json"
    p = json.loads(prof.read_text())
    p["cpu_expert"]["seconds"] = [s / 100 for s in p["cpu_expert"]["seconds"]]
    fast_cpu.write_text(json.dumps(p))
    assert main([str(d), "--profile", str(fast_cpu), "--out", str(tmp_path / "a.parquet")]) == 0
    assert (
        main(
            [
                str(d),
                "--profile",
                str(fast_cpu),
                "--decide-with",
                str(prof),
                "--out",
                str(tmp_path / "b.parquet"),
            ]
        )
        == 0
    )
    a, b = pd.read_parquet(tmp_path / "a.parquet"), pd.read_parquet(tmp_path / "b.parquet")
    cpu = lambda t: t[(t.policy == "oled") & (t.metric == "cpu_experts")].iloc[0]  # noqa: E731
    assert cpu(a).predicted != cpu(a).measured  # the split moved to the CPU
    assert cpu(b).predicted == cpu(b).measured


def test_bad_input_is_named(run_dir, tmp_path, capsys):
    from dllm_offload_sim.validate.repredict import main

    d, prof = run_dir
    assert main([str(d), "--profile", str(prof), "--set", "nosuch.section.x=1"]) == 2
    assert "no section 'nosuch'" in capsys.readouterr().err
    assert main([str(d), "--profile", str(prof), "--set", "runtime.bookeeping_s=1e-3"]) == 2  # a typo
    assert "field 'runtime.bookeeping_s': unknown field" in capsys.readouterr().err
    assert main([str(d), "--profile", str(prof), "--set", "runtime.bookkeeping_s=fast"]) == 2
    assert "VALUE must be JSON" in capsys.readouterr().err
    assert main([str(d), "--profile", str(prof), "--set", "runtime.policy_time_factor=-2"]) == 2
    assert "field 'runtime.policy_time_factor': must be a ratio >= 0, got -2" in capsys.readouterr().err
    assert main([str(tmp_path), "--profile", str(prof)]) == 2
    assert "no .hydra/config.yaml" in capsys.readouterr().err
    assert main([str(d), "--profile", str(prof), "--trace", str(tmp_path / "missing")]) == 2
    assert "pass --trace" in capsys.readouterr().err


def test_a_policy_time_factor_scales_the_decision_time_a_reprediction_charges(run_dir, tmp_path):
    """The runs stored the decision time their simulations measured; re-predicted under a profile whose
    ``runtime.policy_time_factor`` is 1000, each MoE layer is charged 1000 times that, so TPOT rises by that much
    per decode forward, spread over the tokens decoded."""
    from omegaconf import OmegaConf

    from dllm_offload_sim.traces.reader import Trace
    from dllm_offload_sim.traces.schema import PREFILL
    from dllm_offload_sim.validate.repredict import main
    from dllm_offload_sim.validate.run_store import RunStore

    d, prof = run_dir
    assert (
        main(
            [
                str(d),
                "--profile",
                str(prof),
                "--set",
                "runtime.policy_time_factor=1000",
                "--out",
                str(tmp_path / "slow.parquet"),
            ]
        )
        == 0
    )
    new, old = pd.read_parquet(tmp_path / "slow.parquet"), RunStore(d).finished_rows()
    req = Trace.open(OmegaConf.load(d / ".hydra" / "config.yaml").trace.path).request(0)
    per_token = int((req.phase != PREFILL).sum()) / int(req.n_decoded.sum())
    for pol in ("oled", "naive_lru"):
        o, n = _tpot(old, pol), _tpot(new, pol)
        assert o.charged_policy_us_per_layer == pytest.approx(
            o.simulated_policy_us_per_layer
        )  # factor 1 then
        extra_ms = 999 * o.simulated_policy_us_per_layer * 1e-3 * 3 * per_token  # 3 MoE layers a forward
        assert n.predicted - o.predicted == pytest.approx(extra_ms, rel=1e-6)
        assert n.measured == o.measured


def test_the_forwards_are_predicted_again_beside_the_table_and_the_report_reads_them(run_dir, tmp_path):
    """With the run's own profile every forward's prediction comes back unchanged, written beside the table as
    NAME_forwards.parquet; a changed field moves them; ``dllm-report`` on the table reads them (its residual fit)."""
    from dllm_offload_sim.validate.report import load_forwards
    from dllm_offload_sim.validate.repredict import main
    from dllm_offload_sim.validate.run_store import RunStore

    d, prof = run_dir
    assert main([str(d), "--profile", str(prof), "--out", str(tmp_path / "same.parquet")]) == 0
    key = ["policy", "cache", "forward"]
    new = pd.read_parquet(tmp_path / "same_forwards.parquet").sort_values(key).reset_index(drop=True)
    old = RunStore(d).finished_forwards().sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(new, old)
    assert load_forwards([str(tmp_path / "same.parquet")]).equals(
        pd.read_parquet(tmp_path / "same_forwards.parquet")
    )
    assert (
        main(
            [
                str(d),
                "--profile",
                str(prof),
                "--set",
                "runtime.bookkeeping_s=1e-3",
                "--out",
                str(tmp_path / "slow.parquet"),
            ]
        )
        == 0
    )
    slow = pd.read_parquet(tmp_path / "slow_forwards.parquet").sort_values(key).reset_index(drop=True)
    assert (slow.predicted_s > new.predicted_s).all() and slow.measured_s.equals(new.measured_s)


def test_cpu_costs_at_each_runs_measured_bandwidth(run_dir, tmp_path, capsys):
    """``--cpu-at-run-bandwidth``: a profile whose CPU curve was timed at twice the bandwidth a run measured predicts
    that run's CPU experts twice as slow; runs without CPU experts, and the measurements, stay as they were."""
    from dllm_offload_sim.validate.repredict import main
    from dllm_offload_sim.validate.run_store import RunStore

    d, prof = run_dir
    old = RunStore(d).finished_rows()
    mem = old[old.metric == "host_mem_gbps"]
    assert (
        old[(old.policy == "oled") & (old.metric == "cpu_experts")].measured > 0
    ).all()  # OLED ran CPU experts
    at = float(2 * mem.measured.max())
    assert (
        main(
            [
                str(d),
                "--profile",
                str(prof),
                "--set",
                f"cpu_expert.mem_gbps=[{at}]",
                "--decide-with",
                str(prof),
                "--out",
                str(tmp_path / "plain.parquet"),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                str(d),
                "--profile",
                str(prof),
                "--set",
                f"cpu_expert.mem_gbps=[{at}]",
                "--decide-with",
                str(prof),
                "--cpu-at-run-bandwidth",
                "--out",
                str(tmp_path / "scaled.parquet"),
            ]
        )
        == 0
    )
    plain, scaled = pd.read_parquet(tmp_path / "plain.parquet"), pd.read_parquet(tmp_path / "scaled.parquet")
    assert _tpot(scaled, "oled").predicted > _tpot(plain, "oled").predicted  # CPU experts >= 2x slower
    assert _tpot(scaled, "naive_lru").predicted == pytest.approx(_tpot(plain, "naive_lru").predicted)
    assert _tpot(scaled, "oled").measured == _tpot(plain, "oled").measured
    got = scaled[scaled.metric == "host_mem_gbps"].set_index("policy")
    assert (plain[plain.metric == "host_mem_gbps"].predicted == at).all()  # the curve's bandwidth
    for pol, want in mem.set_index("policy").measured.items():  # the run's own bandwidth
        assert got.at[pol, "predicted"] == pytest.approx(want)
    capsys.readouterr()
    assert (
        main([str(d), "--profile", str(prof), "--cpu-at-run-bandwidth"]) == 2
    )  # the profile has no bandwidth
    assert "cpu_expert.mem_gbps" in capsys.readouterr().err


def test_a_profile_at_another_memory_bandwidth_scales_its_cpu_expert_costs_only():
    from dllm_offload_sim.costmodel.profile import ProfileError

    prof = flat_profile(tiny_topology(), cpu_per_token_s=1e-3, cpu_call_overhead_s=5e-4)
    prof.curves["cpu_expert"]["bands"] = [{"after": 8, "seconds": [4e-4, 0.4]}]
    with pytest.raises(ProfileError, match="cpu_expert.mem_gbps"):
        prof.at_memory_bandwidth(100.0)
    prof.curves["cpu_expert"]["mem_gbps"] = [80.0, 120.0]  # timed at 100 GB/s
    slow = prof.at_memory_bandwidth(50.0)
    c, c0 = slow.curves["cpu_expert"], prof.curves["cpu_expert"]
    assert c["seconds"] == pytest.approx([2 * v for v in c0["seconds"]]) and c["bands"][0][
        "seconds"
    ] == pytest.approx([8e-4, 0.8])
    assert (
        c["call_overhead_s"] == c0["call_overhead_s"]
        and slow.curves["cpu_dispatch"] == prof.curves["cpu_dispatch"]
    )
    assert slow.cpu_curve_gbps() == 50.0 and prof.cpu_curve_gbps() == 100.0  # the original is untouched
    with pytest.raises(ProfileError, match="host_mem_gbps"):
        prof.at_memory_bandwidth(0.0)


def test_decisions_here_charges_the_decision_time_measured_now(run_dir, tmp_path):
    """``--decisions-here``: each run's charge is a fresh measurement on this machine (times the profile's factor),
    recorded in the rows; measurements stay as stored."""
    from dllm_offload_sim.validate.repredict import main
    from dllm_offload_sim.validate.run_store import RunStore

    d, prof = run_dir
    assert (
        main(
            [
                str(d),
                "--profile",
                str(prof),
                "--set",
                "runtime.policy_time_factor=2.0",
                "--decisions-here",
                "--out",
                str(tmp_path / "here.parquet"),
            ]
        )
        == 0
    )
    new, old = pd.read_parquet(tmp_path / "here.parquet"), RunStore(d).finished_rows()
    for pol in ("oled", "naive_lru"):
        n = new[new.policy == pol]
        assert n.simulated_policy_us_per_layer.nunique() == 1 and (n.simulated_policy_us_per_layer > 0).all()
        assert np.allclose(n.charged_policy_us_per_layer, 2.0 * n.simulated_policy_us_per_layer)
        assert _tpot(new, pol).measured == _tpot(old, pol).measured


def test_cpu_costs_at_each_runs_engine_probe(run_dir, tmp_path, capsys):
    """``--cpu-at-run-probe``: a profile whose engine probe call took half what a run's took predicts that run's CPU
    experts twice as slow; the replay stored its probe as a ``cpu_probe_ms`` row, predicted by the profile's."""
    from dllm_offload_sim.validate.repredict import main
    from dllm_offload_sim.validate.run_store import RunStore

    d, prof = run_dir
    old = RunStore(d).finished_rows()
    probe = old[old.metric == "cpu_probe_ms"].set_index("policy")
    assert set(probe.index) == {"oled", "naive_lru"} and (probe.measured > 0).all()
    assert probe.predicted.isna().all()  # the flat profile has no probe
    at = float(probe.measured.min()) / 2e3  # seconds: half of every run's probe
    assert (
        main(
            [
                str(d),
                "--profile",
                str(prof),
                "--set",
                f"cpu_expert.probe_s=[{at}]",
                "--decide-with",
                str(prof),
                "--out",
                str(tmp_path / "plain.parquet"),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                str(d),
                "--profile",
                str(prof),
                "--set",
                f"cpu_expert.probe_s=[{at}]",
                "--decide-with",
                str(prof),
                "--cpu-at-run-probe",
                "--out",
                str(tmp_path / "scaled.parquet"),
            ]
        )
        == 0
    )
    plain, scaled = pd.read_parquet(tmp_path / "plain.parquet"), pd.read_parquet(tmp_path / "scaled.parquet")
    assert _tpot(scaled, "oled").predicted > _tpot(plain, "oled").predicted
    assert _tpot(scaled, "naive_lru").predicted == pytest.approx(_tpot(plain, "naive_lru").predicted)
    np.testing.assert_allclose(plain[plain.metric == "cpu_probe_ms"].predicted, 1e3 * at)
    got = scaled[scaled.metric == "cpu_probe_ms"].set_index("policy")
    for pol, want in probe.measured.items():
        assert got.at[pol, "predicted"] == pytest.approx(want)
    capsys.readouterr()
    assert main([str(d), "--profile", str(prof), "--cpu-at-run-probe"]) == 2
    assert "cpu_expert.probe_s" in capsys.readouterr().err


def test_host_terms_at_each_runs_launch_time(run_dir, tmp_path):
    """``--host-at-run-launch``: a profile whose host launched kernels in a tenth of a run's time charges that run
    its runtime host terms ten times over; a profile without host terms predicts as before."""
    from dllm_offload_sim.validate.repredict import main
    from dllm_offload_sim.validate.run_store import RunStore

    d, prof = run_dir
    old = RunStore(d).finished_rows()
    launch = float(old[old.metric == "host_launch_us"].measured.min()) / 10
    base = [
        "--set",
        f"stamp.host_launch_us={launch}",
        "--set",
        "runtime.layer_residual_s=1e-4",
        "--decide-with",
        str(prof),
    ]
    assert main([str(d), "--profile", str(prof), *base, "--out", str(tmp_path / "plain.parquet")]) == 0
    assert (
        main(
            [
                str(d),
                "--profile",
                str(prof),
                *base,
                "--host-at-run-launch",
                "--out",
                str(tmp_path / "scaled.parquet"),
            ]
        )
        == 0
    )
    plain, scaled = pd.read_parquet(tmp_path / "plain.parquet"), pd.read_parquet(tmp_path / "scaled.parquet")
    for pol in ("oled", "naive_lru"):
        assert _tpot(scaled, pol).predicted > _tpot(plain, pol).predicted
    assert (
        scaled[scaled.metric == "host_launch_us"].predicted.to_numpy()
        == old[old.metric == "host_launch_us"].measured.to_numpy()
    ).all()


def test_a_profile_at_another_engine_probe_or_launch_time_scales_only_its_own_terms():
    from dllm_offload_sim.costmodel.profile import ProfileError, validate_profile_dict

    prof = flat_profile(tiny_topology(), cpu_per_token_s=1e-3, cpu_call_overhead_s=5e-4)
    prof.curves["cpu_expert"]["bands"] = [{"after": 8, "seconds": [4e-4, 0.4]}]
    with pytest.raises(ProfileError, match="cpu_expert.probe_s"):
        prof.at_cpu_probe(1e-3)
    prof.curves["cpu_expert"]["probe_s"] = [1e-3, 3e-3]  # 2 ms around the curve
    slow = prof.at_cpu_probe(4e-3)
    c, c0 = slow.curves["cpu_expert"], prof.curves["cpu_expert"]
    assert c["seconds"] == pytest.approx([2 * v for v in c0["seconds"]]) and c["bands"][0][
        "seconds"
    ] == pytest.approx([8e-4, 0.8])
    assert c["call_overhead_s"] == pytest.approx(2 * c0["call_overhead_s"])
    assert slow.curves["cpu_dispatch"] == prof.curves["cpu_dispatch"]
    assert slow.cpu_probe_s() == 4e-3 and prof.cpu_probe_s() == 2e-3
    with pytest.raises(ProfileError, match="cpu_probe_s"):
        prof.at_cpu_probe(-1.0)
    bad = prof.to_dict()
    bad["cpu_expert"]["probe_s"] = [0.0]
    with pytest.raises(ProfileError, match=r"cpu_expert\.probe_s.*got \[0\.0\]"):
        validate_profile_dict(bad, "p.json")

    prof.runtime = {
        "layer_residual_s": 1e-4,
        "cpu_issue_s": 2e-5,
        "grouped_issue_s": 4e-5,
        "cpu_stall_per_copy_s": 3e-6,
        "policy_time_factor": 1.5,
    }
    with pytest.raises(ProfileError, match="stamp.host_launch_us"):
        prof.at_host_launch(20.0)
    prof.stamp["host_launch_us"] = 10.0
    fast = prof.at_host_launch(5.0)
    assert fast.runtime["layer_residual_s"] == pytest.approx(5e-5) and fast.runtime[
        "cpu_issue_s"
    ] == pytest.approx(1e-5)
    assert fast.runtime["grouped_issue_s"] == pytest.approx(2e-5)  # issuing a grouped call is host work too
    assert fast.runtime["cpu_stall_per_copy_s"] == 3e-6 and fast.runtime["policy_time_factor"] == 1.5
    assert fast.stamp["host_launch_us"] == 5.0 and prof.stamp["host_launch_us"] == 10.0
    assert fast.curves == prof.curves
    with pytest.raises(ProfileError, match="host_launch_us"):
        prof.at_host_launch(float("nan"))


def test_the_cpu_engine_at_each_runs_measured_cpu_path(run_dir, tmp_path, capsys):
    """``--cpu-at-run-path``: each run's CPU costs are scaled by its measured decode CPU path over the predicted
    one (a diagnosis: the measurement enters it); a run without CPU experts is predicted as before."""
    from omegaconf import OmegaConf

    from dllm_offload_sim.costmodel import CostModel
    from dllm_offload_sim.sim.run import simulate
    from dllm_offload_sim.traces.reader import Trace
    from dllm_offload_sim.traces.schema import PREFILL
    from dllm_offload_sim.validate.repredict import main, run_cpu_path_factor
    from dllm_offload_sim.validate.run_store import RunStore
    from dllm_offload_sim.validate.comparison import measured_cpu_path_s
    from dllm_offload_sim.wiring.build import make_policy, policy_config

    d, prof = run_dir
    fwd = RunStore(d).finished_forwards()
    cfg = OmegaConf.load(d / ".hydra" / "config.yaml")
    trace = Trace.open(cfg.trace.path)
    sim = simulate(trace, make_policy(policy_config("oled")), 3, CostModel(str(prof)), requests=[0])
    f = fwd[fwd.policy == "oled"]
    dec = np.asarray(f.phase) != PREFILL
    want = measured_cpu_path_s(f, "measured_")[dec].sum() / np.asarray(sim.per_forward.cpu_path_s)[dec].sum()
    assert run_cpu_path_factor(fwd, "oled", 3, sim.per_forward) == pytest.approx(want)
    naive = simulate(trace, make_policy(policy_config("naive_lru")), 3, CostModel(str(prof)), requests=[0])
    assert run_cpu_path_factor(fwd, "naive_lru", 3, naive.per_forward) is None
    with pytest.raises(ValueError, match="oled at Cache 3: --cpu-at-run-path needs"):
        run_cpu_path_factor(None, "oled", 3, sim.per_forward)

    assert (
        main(
            [str(d), "--profile", str(prof), "--decide-with", str(prof), "--out", str(tmp_path / "a.parquet")]
        )
        == 0
    )
    assert (
        main(
            [
                str(d),
                "--profile",
                str(prof),
                "--decide-with",
                str(prof),
                "--cpu-at-run-path",
                "--out",
                str(tmp_path / "b.parquet"),
            ]
        )
        == 0
    )
    a, b = pd.read_parquet(tmp_path / "a.parquet"), pd.read_parquet(tmp_path / "b.parquet")
    assert _tpot(b, "naive_lru").predicted == pytest.approx(_tpot(a, "naive_lru").predicted)
    moved = _tpot(b, "oled").predicted - _tpot(a, "oled").predicted
    assert moved != 0 and np.sign(moved) == np.sign(want - 1)  # the CPU engine as slow (or fast) as measured


def test_the_host_steps_each_run_measured(run_dir, tmp_path, capsys):
    """``--host-at-run-steps``: each run charges the bookkeeping per MoE layer, a grouped call's issue and a CPU call's
    submission its decode forwards measured (a diagnosis: the measurement enters it)."""
    from omegaconf import OmegaConf

    from dllm_offload_sim.costmodel import CostModel
    from dllm_offload_sim.sim.run import simulate
    from dllm_offload_sim.traces.reader import Trace
    from dllm_offload_sim.traces.schema import PREFILL
    from dllm_offload_sim.validate.repredict import main, run_host_steps
    from dllm_offload_sim.validate.run_store import RunStore
    from dllm_offload_sim.wiring.build import make_policy, policy_config

    d, prof = run_dir
    fwd = RunStore(d).finished_forwards()
    trace = Trace.open(OmegaConf.load(d / ".hydra" / "config.yaml").trace.path)
    for label in ("oled", "naive_lru"):
        sim = simulate(
            trace,
            make_policy(policy_config(label)),
            3,
            CostModel(str(prof)),
            requests=[0],
            record_layers=True,
        )
        f = fwd[fwd.policy == label]
        dec = np.asarray(f.phase) != PREFILL
        n_layers = int(dec.sum()) * trace.topology.n_moe_layers
        steps = run_host_steps(fwd, label, 3, sim)
        assert steps["bookkeeping_s"] == pytest.approx(f.measured_bookkeeping_s[dec].sum() / n_layers)
        assert steps["grouped_issue_s"] == pytest.approx(
            f.measured_grouped_issue_s[dec].sum() / f.measured_grouped_calls[dec].sum()
        )
        decode_fwds = set(np.asarray(sim.per_forward.forward)[dec])
        cpu_calls = int(((sim.layers.to_cpu > 0) & sim.layers.forward.isin(decode_fwds)).sum())
        assert (cpu_calls > 0) == (label == "oled")  # OLED runs experts on the CPU here, Naive-LRU never
        if cpu_calls:
            assert steps["cpu_issue_s"] == pytest.approx(f.measured_cpu_issue_s[dec].sum() / cpu_calls)
        else:
            assert "cpu_issue_s" not in steps  # a step the run never took keeps the profile's charge
    assert "cpu_issue_s" not in run_host_steps(
        fwd,
        "naive_lru",
        3,
        simulate(
            trace,
            make_policy(policy_config("naive_lru")),
            3,
            CostModel(str(prof)),
            requests=[0],
            record_layers=True,
        ),
    )
    with pytest.raises(ValueError, match="naive_lru at Cache 3: --host-at-run-steps needs"):
        run_host_steps(None, "naive_lru", 3, sim)
    with pytest.raises(ValueError, match="no measured_bookkeeping_s"):
        run_host_steps(fwd.drop(columns=["measured_bookkeeping_s"]), "naive_lru", 3, sim)

    common = [
        str(d),
        "--profile",
        str(prof),
        "--decide-with",
        str(prof),
        "--set",
        "runtime.bookkeeping_s=0",
        "--set",
        "runtime.grouped_issue_s=0",
    ]
    assert main([*common, "--out", str(tmp_path / "a.parquet")]) == 0
    assert main([*common, "--host-at-run-steps", "--out", str(tmp_path / "b.parquet")]) == 0
    a, b = pd.read_parquet(tmp_path / "a.parquet"), pd.read_parquet(tmp_path / "b.parquet")
    for pol in ("oled", "naive_lru"):  # the measured steps are host time the zeroed profile did not charge
        assert _tpot(b, pol).predicted > _tpot(a, pol).predicted
        assert _tpot(b, pol).measured == _tpot(a, pol).measured


def test_the_decision_time_each_run_measured(run_dir, tmp_path, capsys):
    """``--decisions-at-run``: each run charges the decision time its replay measured, per MoE layer."""
    from omegaconf import OmegaConf

    from dllm_offload_sim.traces.reader import Trace
    from dllm_offload_sim.validate.repredict import main
    from dllm_offload_sim.validate.run_store import RunStore

    d, prof = run_dir
    old = RunStore(d).finished_rows()
    layers = Trace.open(OmegaConf.load(d / ".hydra" / "config.yaml").trace.path).topology.n_moe_layers
    assert (
        main(
            [
                str(d),
                "--profile",
                str(prof),
                "--decide-with",
                str(prof),
                "--decisions-at-run",
                "--out",
                str(tmp_path / "a.parquet"),
            ]
        )
        == 0
    )
    a = pd.read_parquet(tmp_path / "a.parquet")
    for pol in ("oled", "naive_lru"):
        ms = float(old[(old.policy == pol) & (old.metric == "policy_ms_per_forward")].measured.iloc[0])
        assert _tpot(a, pol).charged_policy_us_per_layer == pytest.approx(1e3 * ms / layers)
    capsys.readouterr()
    assert main([str(d), "--profile", str(prof), "--decisions-at-run", "--decisions-here"]) == 2
    assert "pass one" in capsys.readouterr().err


def test_a_profile_with_runtime_terms_set_changes_those_terms_only():
    from dllm_offload_sim.costmodel.profile import ProfileError

    prof = flat_profile(tiny_topology())
    prof.runtime = {"bookkeeping_s": 1e-5, "cpu_issue_s": 2e-5, "policy_time_factor": 1.5}
    out = prof.with_runtime_terms({"bookkeeping_s": 6e-5, "grouped_issue_s": 4e-5}, "a test")
    assert out.runtime == {
        "bookkeeping_s": 6e-5,
        "cpu_issue_s": 2e-5,
        "grouped_issue_s": 4e-5,
        "policy_time_factor": 1.5,
    }
    assert prof.runtime["bookkeeping_s"] == 1e-5 and out.curves == prof.curves
    assert "bookkeeping_s 60.0 us" in out.notes and "a test" in out.notes
    with pytest.raises(ProfileError, match="runtime.policy_time_factor"):
        prof.with_runtime_terms({"policy_time_factor": 2.0}, "x")
    with pytest.raises(ProfileError, match="runtime.bookkeeping_s.*got -1"):
        prof.with_runtime_terms({"bookkeeping_s": -1}, "x")
    with pytest.raises(ProfileError, match="runtime.nonsense_s"):
        prof.with_runtime_terms({"nonsense_s": 1e-5}, "x")
