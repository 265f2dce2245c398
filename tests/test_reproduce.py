"""dllm-reproduce: the ladder's rungs, the claims' arithmetic and verdicts, runs kept and resumed, a report that is
the same from the same runs, and the command's worked example."""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd
import pytest

from dllm_offload_sim.reproduce.claims import CLAIMS, RungResults, evaluate, verdict
from dllm_offload_sim.reproduce.jobs import result_path, run_jobs
from dllm_offload_sim.reproduce.report import Incomplete, write_report
from dllm_offload_sim.reproduce.setups import BASELINES, OLED_FAMILY, PAPER, Plan, ladder

BY_ID = {c.id: c for c in CLAIMS}
FACTORS = ("hardware", "trace_kind", "new_tokens", "paper_switches", "warmup")


def test_each_rung_changes_one_factor_from_the_paper_to_the_project():
    setups = ladder()
    rungs = [s for s in setups if not s.branch]
    assert rungs[0] is PAPER and len(PAPER.paper_switches) == 8 and PAPER.new_tokens == 1024
    last = rungs[-1]
    assert (last.hardware.name, last.trace_kind, last.new_tokens, last.paper_switches, last.warmup) == (
        "h100",
        "real",
        128,
        frozenset(),
        True,
    )
    for a, b in zip(rungs, rungs[1:]):
        changed = [f for f in FACTORS if getattr(a, f) != getattr(b, f)]
        assert len(changed) == 1 and b.parent == a.name, (b.name, changed)
        if changed == ["paper_switches"]:
            assert len(a.paper_switches - b.paper_switches) == 1
    by_name = {s.name: s for s in setups}
    for s in setups:
        if s.branch:
            changed = [f for f in FACTORS if getattr(by_name[s.parent], f) != getattr(s, f)]
            assert len(changed) == 1, (s.name, changed)


def test_rungs_share_the_runs_their_change_does_not_touch():
    plan = Plan(ladder())
    keys = {name: {j.key(): j for j in jobs} for name, jobs in plan.by_setup.items()}
    a, b = keys["real"], keys["oled_confidence"]
    shared = set(a) & set(b)
    assert {a[k].policy.name for k in set(a) - shared} == set(OLED_FAMILY)
    assert all(a[k].policy.name not in OLED_FAMILY for k in shared)
    # the statistics' switch changes nothing Priority alone can feel: its +Priority runs are shared
    c, d = keys["oled_stale_order"], keys["oled_statistics"]
    assert {c[k].policy.name for k in set(c) - set(d)} == {"oled_priority_layeradapt", "oled"}
    assert len(plan.unique_jobs()) < sum(len(v) for v in plan.by_setup.values())


def _rung(rows):
    return RungResults(pd.DataFrame(rows, columns=["model", "policy", "cache", "tpot_ms", "cache_util"]), {})


def test_claims_are_computed_as_the_paper_defines_them():
    rows = []
    for c, scale in ((40, 2.0), (100, 1.0)):
        rows += [
            ("mini", "naive_lru", c, 10 * scale, 0.5),
            ("mini", "oled_priority", c, 8 * scale, 0.6),
            ("mini", "oled_priority_layeradapt", c, 6 * scale, 0.6),
            ("mini", "oled", c, 4 * scale, 0.8),
            ("mini", "moe_infinity", c, 12 * scale, 0.4),
            ("mini", "finemoe", c, 5 * scale, 0.5),
            ("mini", "ktransformers", c, 16 * scale, 0.2),
            ("mini", "belady", c, 3 * scale, 0.9),
        ]
    rows.append(("mini", "full_residency", 40, 2.0, 0.3))
    v = evaluate(_rung(rows))
    assert v["tpot_vs_systems"] == pytest.approx((5 / 4, 16 / 4))
    assert v["util_vs_systems"] == pytest.approx((0.8 / 0.5, 0.8 / 0.2))
    assert v["over_strongest"] == pytest.approx((5 / 4, 5 / 4))  # FineMoE is the strongest at both caches
    assert v["util_strongest"] == pytest.approx((50.0, 80.0))
    assert v["ablation"] == pytest.approx((20.0, 25.0, 100 / 3))
    assert v["vs_lru_40"] == pytest.approx((60.0,)) and v["vs_lru_100"] == pytest.approx((60.0,))
    assert v["above_full_mini"] == pytest.approx((100.0,))  # OLED at Cache 100 is 4 ms, full residency 2
    assert v["gap_to_bound"] == pytest.approx((100 / 3, 100 / 3))  # caches 40 and 100 of Fig. 13's
    assert v["above_full_flash"] is None and v["flash_mini"][0] != v["flash_mini"][0]  # no flash runs: NaN
    assert verdict(BY_ID["flash_mini"], v["flash_mini"]) == "n/a"


@pytest.mark.parametrize(
    "cid,ours,want",
    [
        ("over_strongest", (1.9, 3.5), "reproduced"),
        ("over_strongest", (1.2, 1.5), "direction holds"),
        ("over_strongest", (0.9, 1.5), "partly"),
        ("over_strongest", (0.8, 0.9), "not reproduced"),
        ("vs_lru_100", (31.0,), "reproduced"),
        ("vs_lru_100", (5.0,), "direction holds"),
        ("vs_lru_100", (-8.0,), "not reproduced"),
        ("adjacent_overlap", (87.0,), "reproduced"),
        ("adjacent_overlap", (81.0,), "direction holds"),
        ("adjacent_overlap", (60.0,), "not reproduced"),
        ("boundary_overlap", (70.0,), "reproduced"),
        ("boundary_overlap", (30.0,), "not reproduced"),
        ("confidence_premise", (-0.2,), "not reproduced"),
        ("util_strongest", (40.0, 60.0), "direction holds"),
        ("gap_to_bound", (-40.0, 20.0), "partly"),
        ("above_full_mini", (math.nan,), "n/a"),
    ],
)
def test_verdicts(cid, ours, want):
    assert verdict(BY_ID[cid], ours) == want


def _tiny_plan():
    setups = [replace(s, new_tokens=16) for s in ladder()[:3]]
    setups[2] = replace(setups[2], new_tokens=8)
    return Plan(setups, models=("mini",), caches=(40,), gap_caches=(40,), tokens_total={"mini": 32})


def test_runs_are_kept_resumed_and_the_report_is_the_same_from_the_same_runs(tmp_path):
    plan = _tiny_plan()
    jobs, work = plan.unique_jobs(), tmp_path / "work"
    assert run_jobs(jobs, work) == len(jobs)
    assert run_jobs(jobs, work) == 0  # every run kept: nothing runs again
    outs = []
    for name in ("a", "b"):
        write_report(plan, work, tmp_path / name, "dllm-reproduce (test)")
        outs.append(
            {f: (tmp_path / name / f).read_text() for f in ("REPRODUCTION.md", "claims.csv", "runs.csv")}
        )
    assert outs[0] == outs[1]
    md = outs[0]["REPRODUCTION.md"]
    for c in CLAIMS:
        assert c.text in md
    result_path(work, jobs[0]).unlink()  # a missing run: no report is taken for a complete one
    with pytest.raises(Incomplete, match="1 runs have no result"):
        write_report(plan, work, tmp_path / "c", "dllm-reproduce (test)")
    assert not (tmp_path / "c" / "REPRODUCTION.md").exists()


def test_a_result_of_another_job_under_its_name_is_not_taken(tmp_path):
    plan = _tiny_plan()
    jobs = plan.unique_jobs()[:2]
    run_jobs(jobs[:1], tmp_path)
    result_path(tmp_path, jobs[0]).rename(result_path(tmp_path, jobs[1]))
    assert run_jobs(jobs[1:], tmp_path) == 1


@pytest.mark.slow
def test_the_quick_worked_example(tmp_path):
    """docs/reproduction.md: ``dllm-reproduce --quick --out DIR`` writes REPRODUCTION.md with every claim."""
    from dllm_offload_sim.reproduce.__main__ import main

    assert main(["--quick", "--out", str(tmp_path / "r"), "--jobs", "2"]) == 0
    md = (tmp_path / "r" / "REPRODUCTION.md").read_text()
    assert "Quick mode" in md and all(c.text in md for c in CLAIMS)
    for f in ("claims.csv", "runs.csv", "sensitivity.csv", "ladder.png", "sensitivity.png"):
        assert (tmp_path / "r" / f).stat().st_size > 0
    assert set(BASELINES) <= set(pd.read_csv(tmp_path / "r" / "runs.csv").policy)


def test_the_paper_testbed_experiment_runs_on_the_testbed_profile(tmp_path, monkeypatch):
    """conf/experiment/paper_testbed.yaml: the testbed of each model, the paper's traces under DLLM_PAPER_TRACES."""
    from test_configs import _compose

    from dllm_offload_sim.sim.app import run_table
    from dllm_offload_sim.traces.synth import calibrated_config, write_synthetic_trace

    for model, cal in (("mini", "paper-mini"), ("flash", "paper-flash")):
        write_synthetic_trace(
            calibrated_config(cal, model=model, n_requests=2, max_new_tokens=32), tmp_path / model
        )
    monkeypatch.setenv("DLLM_PAPER_TRACES", str(tmp_path))
    for model, profile in (("mini", "rtx5090-mini"), ("flash", "rtxpro6000-flash")):
        cfg = _compose(
            "experiment=paper_testbed", f"model={model}", "policy=oled_paper", "cache=40", "hydra.mode=RUN"
        )
        t = run_table(cfg, progress=False)
        assert (
            t.profile.iloc[0] == profile and t.profile_status.iloc[0] == "estimated" and t.tpot_ms.iloc[0] > 0
        )
