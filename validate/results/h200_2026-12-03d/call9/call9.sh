# call 9: GPU tests; profile (graphed grouped calls, scripted CPU layers, runtime overheads); validate C40
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit 1
S=$SECONDS; END=${END:-540}; log() { echo "[$((SECONDS-S))s] $*" | tee -a .val/times9.txt; }
pack() { tar czf "$OUT/val.tgz" .val; }
trap pack EXIT
rem() { echo $((END - (SECONDS-S))); }
timeout 120 python -m pytest -q -m gpu tests/test_runtime_gpu.py > .val/gpu_tests9.txt 2>&1; log "gpu tests rc=$?"; tail -2 .val/gpu_tests9.txt
timeout 150 python -m hwprofile --model mini --out .val/profile-mini9.json > .val/prof_mini9.txt 2>&1; log "prof mini rc=$?"; tail -2 .val/prof_mini9.txt
python -c "import json; p=json.load(open('.val/profile-mini9.json')); print('runtime', p.get('runtime'), 'cpu', p['cpu_expert']['seconds'][:3], p['cpu_expert']['call_overhead_s'])"
V() { R=$(rem); [ $R -gt 25 ] || { log "skip $1"; return; }; timeout $R python -m validate quiet=true hydra.run.dir=.val/$1 hw.profile=.val/$2 "validate.policies=[$3]" "validate.caches=[$4]" 2>&1 | grep -v Warning | tee -a .val/$1.txt | grep -E "^\[|TPOT|error|Error"; log "$1 done"; }
V mini9 profile-mini9.json full_residency,lru,oled,ideal,naive_lru,fiddler,tide,ktransformers 40
