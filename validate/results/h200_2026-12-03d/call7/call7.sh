# call 7: GPU tests; host steps (graphed call); profile (graphed grouped curves); validate C40 7 policies
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit 1
S=$SECONDS; END=${END:-500}; log() { echo "[$((SECONDS-S))s] $*" | tee -a .val/times7.txt; }
pack() { tar czf "$OUT/val.tgz" .val; }
trap pack EXIT
rem() { echo $((END - (SECONDS-S))); }
timeout 120 python -m pytest -q -m gpu tests/test_runtime_gpu.py > .val/gpu_tests7.txt 2>&1; log "gpu tests rc=$?"; tail -5 .val/gpu_tests7.txt
timeout 60 python bench/bench_replay_paths.py --gpu-only --json .val/replay_paths7.json > .val/replay_paths7.txt 2>&1; log "replay paths rc=$?"
grep -E "host step|Error|error" .val/replay_paths7.txt
timeout 150 python -m hwprofile --model mini --out .val/profile-mini7.json > .val/prof_mini7.txt 2>&1; log "prof mini rc=$?"; tail -3 .val/prof_mini7.txt
V() { R=$(rem); [ $R -gt 25 ] || { log "skip $1"; return; }; timeout $R python -m validate quiet=true hydra.run.dir=.val/$1 hw.profile=.val/$2 "validate.policies=[$3]" "validate.caches=[$4]" 2>&1 | grep -v Warning | tee -a .val/$1.txt | grep -E "^\[|TPOT|error|Error"; log "$1 done"; }
V mini7 profile-mini7.json full_residency,lru,oled,naive_lru,fiddler,ideal,tide 40
