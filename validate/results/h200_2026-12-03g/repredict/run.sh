#!/usr/bin/env bash
# Findings 25-27 of REPORT.md (2026-12-03g): this lease's mini runs predicted again on a CPU machine (~30 s).
# Each what-if keeps the validated decisions (--decide-with the run's own profile) and changes only timing.
set -euo pipefail
D=validate/results/h200_2026-12-03g
O=$D/repredict
P=$D/profile-mini.json
python -m validate.repredict $D/mini --profile $P --out $O/own.parquet                     # = the stored predictions
python -m validate.repredict $D/mini --profile h200-mini --decide-with $P --out $O/shipped.parquet
python -m validate.repredict $D/mini --profile validate/results/h200_2026-12-03f/profile-mini.json --decide-with $P --out $O/p03f.parquet
python -m validate.repredict $D/mini --profile $P --set runtime.cpu_stall_per_copy_s=0 --decide-with $P --out $O/no_stall.parquet
python -m validate.repredict $D/mini --profile $P --set cpu_expert.call_overhead_s=0.0009915 --decide-with $P --out $O/call_plus_0.5ms.parquet
python -m validate.repredict $D/mini --profile $P --set cpu_expert.call_overhead_s=0.0014915 --decide-with $P --out $O/call_plus_1ms.parquet
python - "$O" <<'PY' | tee "$O/compare.txt"
import sys, pandas as pd
o = sys.argv[1]
cols = []
for n in ["own", "shipped", "p03f", "no_stall", "call_plus_0.5ms", "call_plus_1ms"]:
    f = pd.read_parquet(f"{o}/{n}.parquet")
    cols.append((100 * f[f.metric == "tpot_ms"].set_index(["policy", "cache"]).signed_rel_err).rename(n))
t = pd.concat(cols, axis=1)
print("TPOT signed error % (measured: the median of 3 repeats)")
print(t.round(1).to_string())
print("median |error| %:", t.abs().median().round(1).to_dict())
PY
