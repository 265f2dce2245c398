"""``python -m validate.report FIDELITY [...]``: the fidelity tables as Markdown.

Per model: one row per validated run (policy x cache) with predicted and measured TPOT and prefill
(TTFT forward) time and their signed errors, whether the counters (hits, demand copies, CPU experts,
prefetch copies) agree exactly, and the policy's decision time per forward; then the median and
maximum absolute errors against the targets (median <= 5%, max <= 10%). Reads the tables
``python -m validate`` writes; prints the Markdown or writes it to ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from traces.atomic import atomic_write_text
from validate.error_stats import error_stats
from validate.fidelity import COUNTERS
from validate.figure import TABLES_HELP, load_tables_cli

TARGET_MEDIAN, TARGET_MAX = 0.05, 0.10  # |TPOT error| across a sweep (the validator issue's targets)


def run_table(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, policy, cache): predicted/measured TPOT and prefill, errors, counters, decision time."""
    key = ["model", "policy", "cache"] if "model" in table else ["policy", "cache"]
    rows = []
    for k, g in table.groupby(key, sort=False):
        m = g.set_index("metric")
        r = dict(zip(key, k if isinstance(k, tuple) else (k,)))
        for met in ("tpot_ms", "prefill_ms"):
            r[f"{met}_pred"], r[f"{met}_meas"] = float(m.at[met, "predicted"]), float(m.at[met, "measured"])
            r[f"{met}_err"] = float(m.at[met, "signed_rel_err"])
        cnt = m.loc[m.index.isin(COUNTERS)]
        r["counters_equal"] = bool((cnt.predicted == cnt.measured).all())
        r["decision_ms"] = float(m.at["policy_ms_per_forward", "measured"]) if "policy_ms_per_forward" in m.index \
            else float("nan")
        rows.append(r)
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame) -> str:
    runs = run_table(table)
    out = []
    groups = runs.groupby("model", sort=False) if "model" in runs else [("", runs)]
    for model, g in groups:
        if model:
            out.append(f"### {model}\n")
        out.append("| policy | Cache | TPOT predicted ms | TPOT measured ms | error | prefill predicted ms | "
                   "prefill measured ms | error | counters | decision ms / forward |")
        out.append("|---|---|---|---|---|---|---|---|---|---|")
        for _, r in g.iterrows():
            out.append(f"| {r.policy} | {r.cache} | {r.tpot_ms_pred:.2f} | {r.tpot_ms_meas:.2f} | "
                       f"{100 * r.tpot_ms_err:+.1f}% | {r.prefill_ms_pred:.1f} | {r.prefill_ms_meas:.1f} | "
                       f"{100 * r.prefill_ms_err:+.1f}% | {'equal' if r.counters_equal else '**differ**'} | "
                       f"{r.decision_ms:.2f} |")
        out.append("")
    for name, met in (("TPOT", "tpot_ms"), ("prefill (TTFT forward)", "prefill_ms")):
        s = error_stats(table, met)
        out.append(f"- {name}: median |error| {100 * s['median']:.1f}%, max {100 * s['max']:.1f}% over {s['runs']} runs; "
                   f"{s['within_5']} within 5%, {s['within_10']} within 10%.")
    s = error_stats(table)
    ok = s["median"] <= TARGET_MEDIAN and s["max"] <= TARGET_MAX
    out.append(f"- Targets (median <= {TARGET_MEDIAN:.0%}, max <= {TARGET_MAX:.0%}): "
               f"{'met' if ok else '**not met**'}.")
    n_bad = int((~runs.counters_equal).sum())
    out.append("- Counters (hits, demand copies, CPU experts, prefetch copies): "
               + ("equal in every run." if n_bad == 0 else f"**differ in {n_bad} runs**."))
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m validate.report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Example: python -m validate.report validate/results/mini/fidelity.parquet "
                                       "validate/results/flash/fidelity.parquet --out validate/results/tables.md")
    p.add_argument("tables", nargs="+", help=TABLES_HELP)
    p.add_argument("--out", help="write the Markdown here (default: print it)")
    a = p.parse_args(argv)
    table = load_tables_cli(a.tables)
    if table is None:
        return 2
    text = markdown(table)
    if a.out:
        atomic_write_text(Path(a.out), text)
        print(f"wrote {a.out}")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
