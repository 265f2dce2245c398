#!/usr/bin/env bash
# Stored H200 measurements predicted again on a CPU machine (no GPU): which profile predicts them best, and
# what-ifs of the stall term. Run from the repository root: bash validate/results/h200_2026-12-03f/repredict/run.sh
set -euo pipefail
R=validate/results; E=$R/h200_2026-12-03e; F=$R/h200_2026-12-03f; O=$F/repredict
# the three mini profiles of the current profiler: call10 (2026-12-03d, shipped), 2026-12-03e, 2026-12-03f
python -m hwprofile.merge h200-mini $E/profile-mini.json $F/profile-mini.json --name h200-mini-median3 --out $O/median3.json
python -m hwprofile.merge h200-mini $F/profile-mini.json --name h200-mini-not-e --out $O/not_e.json  # leave 03e out
python -m hwprofile.merge h200-mini $E/profile-mini.json --name h200-mini-not-f --out $O/not_f.json  # leave 03f out
for L in e f; do
    D=$R/h200_2026-12-03$L/mini; OWN=$R/h200_2026-12-03$L/profile-mini.json
    python -m validate.repredict $D --profile $OWN --out $O/${L}_own.parquet > $O/${L}_own.txt
    python -m validate.repredict $D --profile h200-mini --decide-with $OWN --out $O/${L}_shipped.parquet > $O/${L}_shipped.txt
    python -m validate.repredict $D --profile $O/not_$L.json --decide-with $OWN --out $O/${L}_others.parquet > $O/${L}_others.txt
    python -m validate.repredict $D --profile $O/median3.json --decide-with $OWN --out $O/${L}_median3.parquet > $O/${L}_median3.txt
done
for S in 5e-5 1e-4; do  # what-ifs (diagnosis, never shipped): 03f's own profile with a larger stall per copy
    python -m validate.repredict $F/mini --profile $F/profile-mini.json --set runtime.cpu_stall_per_copy_s=$S \
        --out $O/f_stall_$S.parquet > $O/f_stall_$S.txt
done
python -m validate.repredict $F/mini --profile $F/profile-mini.json --decide-with $F/profile-mini.json \
    --set runtime.cpu_call_s=5e-4 --out $O/f_call_5e-4.parquet > $O/f_call_5e-4.txt  # a constant per CPU layer instead
python $O/compare.py > $O/compare.txt
cat $O/compare.txt
