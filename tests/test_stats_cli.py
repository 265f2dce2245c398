"""The analytics command runs on the shipped trace and writes its tables and plots."""

import json

import pytest

from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.traces.shipped import (
    BLOCK32_TRACE,
    REAL_TRACES,
    SHIPPED_MAX_BYTES,
    SHIPPED_TRACES,
    SYNTHETIC_TRACE,
    default_trace_path,
    shipped_trace_path,
)
from dllm_offload_sim.traces.stats import main


def test_shipped_traces_are_valid_and_small():
    total = 0
    for name in SHIPPED_TRACES:
        p = shipped_trace_path(name)
        total += sum(f.stat().st_size for f in p.iterdir())
        tr = Trace.open(p)
        tr.validate()
        assert tr.topology.n_experts == 256 and tr.block_length == (32 if name == BLOCK32_TRACE else 16)
    assert total <= SHIPPED_MAX_BYTES  # 20 MB
    real = Trace.open(default_trace_path())
    assert real.source == "collected" and real.meta["decoding"]["threshold"] == 0.9


def test_stats_cli_on_synthetic_trace(tmp_path, capsys):
    assert main([str(shipped_trace_path(SYNTHETIC_TRACE)), "--out", str(tmp_path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "adjacent_overlap" in out and "boundary_overlap" in out and "distinct_experts_per_layer" in out
    for f in (
        "summary.json",
        "overlap.csv",
        "layers.csv",
        "confidence.csv",
        "stability_layers.csv",
        "fig7_overlap_vs_gap.png",
        "fig4_footprint_flops.png",
        "fig10_confidence_layers.png",
    ):
        assert (tmp_path / f).stat().st_size > 0, f
    s = json.loads((tmp_path / "summary.json").read_text())
    assert 0.85 <= s["adjacent_overlap"] <= 0.90


def test_stats_cli_bad_trace(tmp_path, capsys):
    assert main([str(tmp_path / "missing"), "--quiet", "--no-plots"]) == 2
    assert "no such trace directory" in capsys.readouterr().err


def test_stats_cli_compares_traces_side_by_side(tmp_path, capsys):
    out = tmp_path / "cmp"
    rc = main(
        [
            SYNTHETIC_TRACE,
            "--compare",
            REAL_TRACES[0],
            "--requests",
            "2",
            "--max-gap",
            "2",
            "--no-plots",
            "--quiet",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "Compared with other traces" in text and REAL_TRACES[0] in text
    import pandas as pd

    t = pd.read_csv(out / "compare.csv", index_col="metric")
    assert list(t.columns) == [SYNTHETIC_TRACE, REAL_TRACES[0]]
    assert (
        float(t.loc["tokens_per_forward", SYNTHETIC_TRACE])
        > 2
        > float(t.loc["tokens_per_forward", REAL_TRACES[0]])
    )
    # the synthetic trace is built to behave as the paper measured; the shipped real one (a weak model) is not
    assert "distance from LLaDA2.0's behaviour" in text
    assert f"{SYNTHETIC_TRACE} is closer than {REAL_TRACES[0]} on 3 of 3 behaviours" in text
    assert float(t.loc["llada2_gap_boundary_overlap", SYNTHETIC_TRACE]) == 0.0
    assert (
        main(
            [
                SYNTHETIC_TRACE,
                "--compare",
                str(tmp_path / "nope"),
                "--quiet",
                "--no-plots",
                "--out",
                str(tmp_path / "x"),
            ]
        )
        == 2
    )
    assert "no such trace directory" in capsys.readouterr().err


def test_behaviour_gaps_measure_the_distance_from_llada2():
    import math

    from dllm_offload_sim.traces.likeness import BehaviourGaps, compare

    like = {
        "tokens_per_forward": 2.55,
        "boundary_overlap": 0.7,
        "stability_conf_0.9_up": 0.9,
        "stability_conf_below_0.5": 0.6,
    }
    weak = {
        "tokens_per_forward": 0.95,
        "boundary_overlap": 0.26,
        "stability_conf_0.9_up": 0.2,
        "stability_conf_below_0.5": 0.75,
    }
    g = BehaviourGaps.of(like)
    assert g.as_dict() == {"tokens_per_forward": 0.0, "boundary_overlap": 0.0, "confident_routes_kept": 0.0}
    w = BehaviourGaps.of(weak)
    assert math.isclose(w.tokens_per_forward, 1.6 / 2.55) and math.isclose(w.boundary_overlap, 0.39 / 0.65)
    assert math.isclose(w.confident_routes_kept, 0.55)
    assert (
        BehaviourGaps.of({**like, "tokens_per_forward": 3.06}).tokens_per_forward > 0
    )  # too many is unlike too
    assert BehaviourGaps.of({**like, "stability_conf_0.9_up": float("nan")}).confident_routes_kept == math.inf
    c = compare(g, w)
    assert (c["a_closer_on"], c["b_closer_on"]) == (3, 0)
    assert compare(g, g)["per_behaviour"] == dict.fromkeys(BehaviourGaps.NAMES, "tie")


def test_route_kept_per_layer_separates_decoded_and_still_masked_tokens(tmp_path):
    """A token decoded at forward 1 changes its experts in the first layer and keeps them in the second; a confident
    token that stays masked keeps both; an unsure one keeps neither: the per-layer table says so, group by group."""
    import numpy as np

    from dllm_offload_sim.traces.analytics import compute_stats
    from dllm_offload_sim.traces.schema import DENOISE, PREFILL
    from tests.simkit import request_from_routing, tiny_topology, write_requests

    topo = tiny_topology(n_moe=2, n_experts=8, top_k=2)
    f1 = [[[0, 1], [2, 3]], [[0, 1], [2, 3]], [[0, 1], [2, 3]]]  # rows: decoded, sure, unsure; [layer][k]
    f2 = [[[4, 5], [2, 3]], [[0, 1], [2, 3]], [[6, 7], [4, 5]]]
    req = request_from_routing(
        0,
        [[[[0, 1], [2, 3]]], f1, f2],
        phases=[PREFILL, DENOISE, DENOISE],
        confidence=[[float("nan")], [0.95, 0.6, 0.1], [0.2, 0.7, 0.2]],
        block_of=[0, 1, 1],
        decoded=[0, 1, 0],
    )
    req.was_masked = np.array([False, True, True, True, False, True, True])
    req.decoded = np.array([False, True, False, False, False, False, False])
    path = write_requests(tmp_path / "t", topo, [req])
    t = compute_stats(Trace.open(path)).stability_layers
    assert t.layer.tolist() == [1, 2]
    assert t.decoded.tolist() == [0.0, 1.0] and t["masked_conf_0.5_up"].tolist() == [1.0, 1.0]
    assert t["masked_conf_below_0.3"].tolist() == [0.0, 0.0]
    assert (t.n_decoded == 1).all() and (t["n_masked_conf_0.5_up"] == 1).all()


def test_shipped_traces_are_opened_by_name_and_by_the_simulators_trace_choices(tmp_path, monkeypatch):
    """Trace.open and dllm-stats --compare take a shipped trace's name, and the simulator's trace= choices
    (default, gsm8k, synthetic) where no folder of that name exists here."""
    from dllm_offload_sim.traces.reader import Trace
    from dllm_offload_sim.traces.shipped import DEFAULT_TRACE, SYNTHETIC_TRACE

    monkeypatch.chdir(tmp_path)
    assert Trace.open(SYNTHETIC_TRACE).path.name == SYNTHETIC_TRACE
    assert Trace.open("default").path.name == DEFAULT_TRACE
    (tmp_path / "default").mkdir()  # a folder of the user's by that name wins (and is no trace)
    with pytest.raises(Exception, match="default"):
        Trace.open("default")
