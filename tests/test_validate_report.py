"""The Markdown fidelity report: one row per run, errors and counters as the fidelity table says."""

import pandas as pd

from dllm_offload_sim.validate.comparison import COUNTERS
from dllm_offload_sim.validate.error_stats import error_stats
from dllm_offload_sim.validate.report import main, markdown, run_table


def _table():
    rows = []
    for pol, cache, tp, tm, cnt_meas in (("oled", 40, 10.0, 10.4, 5), ("lru", 40, 12.0, 10.0, 7)):
        for met, p, m in (("tpot_ms", tp, tm), ("prefill_ms", 100.0, 110.0)):
            rows.append(
                {
                    "model": "llada2-mini",
                    "policy": pol,
                    "cache": cache,
                    "metric": met,
                    "predicted": p,
                    "measured": m,
                    "signed_rel_err": (p - m) / m,
                    "abs_rel_err": abs(p - m) / m,
                }
            )
        for c in COUNTERS:
            rows.append(
                {
                    "model": "llada2-mini",
                    "policy": pol,
                    "cache": cache,
                    "metric": c,
                    "predicted": 5.0,
                    "measured": float(cnt_meas),
                    "signed_rel_err": 0.0,
                    "abs_rel_err": 0.0,
                }
            )
        rows.append(
            {
                "model": "llada2-mini",
                "policy": pol,
                "cache": cache,
                "metric": "policy_ms_per_forward",
                "predicted": float("nan"),
                "measured": 0.25,
                "signed_rel_err": float("nan"),
                "abs_rel_err": float("nan"),
            }
        )
    return pd.DataFrame(rows)


def test_run_table_has_one_row_per_run_with_signed_errors():
    runs = run_table(_table())
    assert list(runs.policy) == ["oled", "lru"]
    oled = runs.iloc[0]
    assert abs(oled.tpot_ms_err - (10.0 - 10.4) / 10.4) < 1e-12
    assert oled.counters_equal and not runs.iloc[1].counters_equal
    assert oled.decision_ms == 0.25


def test_host_launch_of_profile_and_run_side_by_side():
    t = _table()
    md = markdown(t)
    assert "| 0.25 | - |" in md  # tables written before the column existed
    extra = pd.DataFrame(
        [
            {
                "model": "llada2-mini",
                "policy": "oled",
                "cache": 40,
                "metric": "host_launch_us",
                "predicted": 9.5,
                "measured": 12.25,
                "signed_rel_err": (9.5 - 12.25) / 12.25,
                "abs_rel_err": (12.25 - 9.5) / 12.25,
            }
        ]
    )
    md = markdown(pd.concat([t, extra], ignore_index=True))
    assert "| 0.25 | 9.5 / 12.2 | - |" in md and "| 0.25 | - | - |" in md  # lru has none
    assert error_stats(pd.concat([t, extra], ignore_index=True))["runs"] == 2  # not a TPOT error


def test_host_memory_bandwidth_of_the_cpu_curve_and_the_run_side_by_side():
    rows = [
        {
            "model": "llada2-mini",
            "policy": p,
            "cache": 40,
            "metric": "host_mem_gbps",
            "predicted": prof,
            "measured": 112.34,
            "signed_rel_err": 0.0,
            "abs_rel_err": 0.0,
        }
        for p, prof in (("oled", 95.0), ("lru", float("nan")))
    ]
    t = pd.concat([_table(), pd.DataFrame(rows)], ignore_index=True)
    md = markdown(t)
    assert "| - | 95.0 / 112.3 |" in md and "| - | - / 112.3 |" in md  # lru's profile had no probe
    assert error_stats(t)["runs"] == 2  # not a TPOT error


def test_error_summary_and_targets_in_the_markdown():
    s = error_stats(_table())
    assert s["runs"] == 2 and abs(s["max"] - 0.2) < 1e-12 and s["within_5"] == 1
    md = markdown(_table())
    assert "| oled | 40 | 10.00 | 10.40 | -3.8% |" in md
    assert "**not met**" in md and "**differ in 1 runs**" in md


def test_cli_writes_the_report(tmp_path, capsys):
    src = tmp_path / "fidelity.parquet"
    _table().to_parquet(src)
    assert main([str(src), "--out", str(tmp_path / "r.md")]) == 0
    assert (tmp_path / "r.md").read_text().startswith("### llada2-mini")
    assert main([str(tmp_path / "missing.parquet")]) == 2
    assert "no such fidelity table" in capsys.readouterr().err


def test_partial_sweep_directory_reads_its_finished_runs(tmp_path, capsys):
    from dllm_offload_sim.validate.figure import load_tables
    from dllm_offload_sim.validate.run_store import RunStore

    t = _table()
    store = RunStore(tmp_path)
    for (pol, cache), g in t.groupby(["policy", "cache"], sort=False):
        store.save(pol, cache, "k", g.to_dict("records"), pd.DataFrame({"forward": [0]}))
    (tmp_path / "runs" / "lru_c40" / "done.json").unlink()  # this run was interrupted
    got = load_tables([tmp_path])
    assert set(got.policy) == {"oled"}
    assert "partial sweep" in capsys.readouterr().err
    t.to_parquet(tmp_path / "fidelity.parquet")  # a complete sweep: its table wins
    assert set(load_tables([tmp_path]).policy) == {"oled", "lru"}


def test_directory_validated_more_than_once_reads_every_finished_run(tmp_path, capsys):
    """One cache per invocation into the same directory: fidelity.parquet holds the last invocation's runs,
    the report and figure take every finished run."""
    from dllm_offload_sim.validate.figure import load_tables
    from dllm_offload_sim.validate.run_store import RunStore

    t = _table()
    t40, t20 = t, t.assign(cache=20)
    store = RunStore(tmp_path)
    for (pol, cache), g in pd.concat([t40, t20]).groupby(["policy", "cache"], sort=False):
        store.save(pol, cache, "k", g.to_dict("records"), pd.DataFrame({"forward": [0]}))
    t20.to_parquet(tmp_path / "fidelity.parquet")  # the last invocation validated Cache 20 only
    got = load_tables([tmp_path])
    assert set(zip(got.policy, got.cache)) == {("oled", 40), ("lru", 40), ("oled", 20), ("lru", 20)}
    assert "using all 4 finished runs" in capsys.readouterr().err


def test_report_says_where_the_time_goes_from_the_per_forward_tables(tmp_path, capsys):
    """A run directory's per-forward tables give the decode forwards' mean time, gap and components;
    columns an older run lacks stay empty; the prefill forward is left out."""
    from dllm_offload_sim.validate.run_store import RunStore

    t = _table()
    store = RunStore(tmp_path)
    fwd = {
        "oled": pd.DataFrame(
            {
                "forward": [0, 1, 2],
                "phase": [0, 1, 1],
                "predicted_s": [1.0, 0.010, 0.020],
                "measured_s": [2.0, 0.012, 0.024],
                "model": "llada2-mini",
                "policy": "oled",
                "cache": 40,
                "predicted_cpu_path_s": [0.5, 0.004, 0.006],
                "measured_cpu_wait_x_s": [0.0, 0.001, 0.001],
                "measured_cpu_jobs_s": [0.0, 0.0, 0.0],
                "measured_cpu_compute_s": [0.9, 0.004, 0.008],
                "measured_gpu_backlog_s": [0.0, 0.0002, 0.0004],
                "measured_cpu_start_delay_s": [0.0, 0.0001, 0.0003],
                "measured_cpu_return_delay_s": [0.0, 0.0002, 0.0002],
                "measured_cpu_issue_s": [0.0, 0.0001, 0.0003],
                "measured_prefetch_issue_s": [0.0, 0.0004, 0.0008],
            }
        ),
        "lru": pd.DataFrame(
            {
                "forward": [0, 1],
                "phase": [0, 1],
                "predicted_s": [1.0, 0.030],
                "measured_s": [1.0, 0.033],
                "policy": "lru",
                "cache": 40,
            }
        ),
    }
    for (pol, cache), g in t.groupby(["policy", "cache"], sort=False):
        store.save(pol, cache, "k", g.to_dict("records"), fwd[pol])
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "### Where the time goes" in out
    # oled decode forwards: predicted 15 ms, measured 18, gap 3, CPU path 5 predicted / 7 measured, backlog 0.3,
    # the CPU call's issue 0.2, the prefetch events 0.6, the worker delays
    assert (
        "| oled | 40 | 15.00 | 18.00 | 3.00 | 5.00 | 7.00 | 0.30 |  |  |  | 0.20 | 0.60 | 0.20 / 0.20 |"
        in out
    )
    assert (
        "| lru | 40 | 30.00 | 33.00 | 3.00 |  |  |  |  |  |  |  |  |  |" in out
    )  # an older run: columns left empty


def test_the_native_engines_cpu_path_is_read_from_its_gpu_clock_column(tmp_path, capsys):
    """With the native engine stream-ordered, the replay records each forward's CPU paths on the GPU's clock
    (``cpu_path_s``) and leaves the reference engine's worker times at 0: the report's measured CPU path reads it."""
    from dllm_offload_sim.validate.run_store import RunStore

    t = _table()
    store = RunStore(tmp_path)
    zeros = [0.0, 0.0, 0.0]
    fwd = pd.DataFrame(
        {
            "forward": [0, 1, 2],
            "phase": [0, 1, 1],
            "predicted_s": [1.0, 0.010, 0.020],
            "measured_s": [2.0, 0.012, 0.024],
            "model": "llada2-mini",
            "cache": 40,
            "predicted_cpu_path_s": [0.5, 0.004, 0.006],
            "measured_cpu_wait_x_s": zeros,
            "measured_cpu_jobs_s": zeros,
            "measured_cpu_compute_s": zeros,
            "measured_cpu_path_s": [0.4, 0.003, 0.009],
        }
    )
    for (pol, cache), g in t.groupby(["policy", "cache"], sort=False):
        store.save(pol, cache, "k", g.to_dict("records"), fwd.assign(policy=pol))
    assert main([str(tmp_path)]) == 0
    assert "| oled | 40 | 15.00 | 18.00 | 3.00 | 5.00 | 6.00 |" in capsys.readouterr().out


def test_repeated_runs_show_their_range_and_whether_the_prediction_is_inside():
    t = _table()
    t["repeats"], t["measured_min"], t["measured_max"] = 3, t.measured, t.measured
    tp = t.metric == "tpot_ms"
    t.loc[tp & (t.policy == "oled"), ["measured_min", "measured_max"]] = [9.8, 11.0]  # 10.0 predicted: inside
    t.loc[tp & (t.policy == "lru"), ["measured_min", "measured_max"]] = [9.0, 11.0]  # 12.0 predicted: outside
    md = markdown(t)
    assert "| 3: 9.80 .. 11.00 (inside) |" in md and "| 3: 9.00 .. 11.00 |" in md
    assert "2 runs replayed more than once" in md and "within the measured range in 1 of them" in md
    assert "spread (max - min) / measured: median 15.8%, max 20.0%" in md  # 1.2/10.4, 2/10: mean of the two
    oled_hits = (t.policy == "oled") & (t.metric == "hits")
    t.loc[oled_hits, "measured_max"] = 6.0  # one repeat copied or hit differently
    assert not run_table(t).iloc[0].counters_equal


def test_tables_without_repeat_columns_read_as_one_repeat():
    runs = run_table(_table())
    assert (runs.repeats == 1).all()
    assert "| 1 |" in markdown(_table()) and "replayed more than once" not in markdown(_table())
