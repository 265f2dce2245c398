"""The re-predictions of run.sh side by side, over the runs whose counters still equal the measurement."""
import pandas as pd

from validate.report import run_table

O = "validate/results/h200_2026-12-03f/repredict"
CPU_PATH = ["oled", "ideal", "tide", "ktransformers"]


def stats(s):
    e = s.tpot_ms_err.abs()
    return f"{len(s):3d} runs median {100 * e.median():5.1f}% max {100 * e.max():5.1f}%" if len(s) else "  0 runs"


for lease in "ef":
    tabs = {k: run_table(pd.read_parquet(f"{O}/{lease}_{k}.parquet")).set_index(["policy", "cache"])
            for k in ("own", "shipped", "others", "median3")}
    common = tabs["own"].index
    for t in tabs.values():
        common = common.intersection(t[t.counters_equal].index)
    print(f"lease 2026-12-03{lease}: {len(common)} of {len(tabs['own'])} runs with equal counters under every profile")
    for k, t in tabs.items():
        s = t.loc[common]
        cpu = s.index.get_level_values(0).isin(CPU_PATH)
        print(f"  {k:8s} all {stats(s)} | GPU-path {stats(s[~cpu])} | CPU-path {stats(s[cpu])}")
for name, s in [("stall", "5e-5"), ("stall", "1e-4"), ("call", "5e-4")]:
    t = run_table(pd.read_parquet(f"{O}/f_{name}_{s}.parquet"))
    field = {"stall": "cpu_stall_per_copy_s", "call": "cpu_call_s"}[name]
    print(f"2026-12-03f, own profile, {field} = {s}: "
          + ", ".join(f"{r.policy} {r.cache} {100 * r.tpot_ms_err:+.1f}%" for r in t.itertuples()
                      if r.policy in CPU_PATH))
