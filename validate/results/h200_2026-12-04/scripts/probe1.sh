python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit 1
mkdir -p $OUT/r; S=$SECONDS
log(){ echo "[$(date +%T) +$((SECONDS-S))s] $*" | tee -a $OUT/r/times.txt; }
{ nproc; cat /proc/loadavg; ps -eo pcpu,pid,comm --sort=-pcpu | head -8; } > $OUT/r/ps.txt
python -m hwprofile --model mini --out $OUT/r/mini_a.json > $OUT/r/prof_a.txt 2>&1; log "a rc=$?"
python -m hwprofile --model mini --out $OUT/r/mini_b.json > $OUT/r/prof_b.txt 2>&1; log "b rc=$?"
python -m hwprofile.compare $OUT/r/mini_a.json $OUT/r/mini_b.json > $OUT/r/cmp_ab.txt; cat $OUT/r/cmp_ab.txt
timeout $((570-(SECONDS-S))) python bench/bench_profile_repro.py --model mini --threads 16 8 4 --repeats 3 --out $OUT/r/repro_mini.json | tee $OUT/r/repro_mini.txt; log "repro rc=$?"
