"""The Markdown fidelity report: one row per run, errors and counters as the fidelity table says."""

import pandas as pd

from validate.fidelity import COUNTERS
from validate.error_stats import error_stats
from validate.report import main, markdown, run_table


def _table():
    rows = []
    for pol, cache, tp, tm, cnt_meas in (("oled", 40, 10.0, 10.4, 5), ("lru", 40, 12.0, 10.0, 7)):
        for met, p, m in (("tpot_ms", tp, tm), ("prefill_ms", 100.0, 110.0)):
            rows.append({"model": "llada2-mini", "policy": pol, "cache": cache, "metric": met, "predicted": p,
                         "measured": m, "signed_rel_err": (p - m) / m, "abs_rel_err": abs(p - m) / m})
        for c in COUNTERS:
            rows.append({"model": "llada2-mini", "policy": pol, "cache": cache, "metric": c, "predicted": 5.0,
                         "measured": float(cnt_meas), "signed_rel_err": 0.0, "abs_rel_err": 0.0})
        rows.append({"model": "llada2-mini", "policy": pol, "cache": cache, "metric": "policy_ms_per_forward",
                     "predicted": float("nan"), "measured": 0.25, "signed_rel_err": float("nan"),
                     "abs_rel_err": float("nan")})
    return pd.DataFrame(rows)


def test_run_table_has_one_row_per_run_with_signed_errors():
    runs = run_table(_table())
    assert list(runs.policy) == ["oled", "lru"]
    oled = runs.iloc[0]
    assert abs(oled.tpot_ms_err - (10.0 - 10.4) / 10.4) < 1e-12
    assert oled.counters_equal and not runs.iloc[1].counters_equal
    assert oled.decision_ms == 0.25


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
    from validate.figure import load_tables
    from validate.run_store import RunStore

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
