# call 10: profile (graphed grouped calls, runtime overheads); validate C40 and C100 with GIL switch 0.1 ms
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit 1
S=$SECONDS; END=${END:-400}; log() { echo "[$((SECONDS-S))s] $*" | tee -a .val/times10.txt; }
pack() { tar czf "$OUT/val.tgz" .val; }
trap pack EXIT
rem() { echo $((END - (SECONDS-S))); }
timeout 150 python -m hwprofile --model mini --out .val/profile-mini10.json > .val/prof_mini10.txt 2>&1; log "prof mini rc=$?"; tail -1 .val/prof_mini10.txt
python -c "import json; p=json.load(open('.val/profile-mini10.json')); print('runtime', p.get('runtime'), 'cpu', p['cpu_expert']['seconds'][:3], p['cpu_expert']['call_overhead_s'], p['stamp']['host_launch_us'])"
V() { R=$(rem); [ $R -gt 25 ] || { log "skip $1 $4"; return; }; timeout $R python -m validate quiet=true hydra.run.dir=.val/$1 hw.profile=.val/$2 "validate.policies=[$3]" "validate.caches=[$4]" 2>&1 | grep -v Warning | tee -a .val/$1.txt | grep -E "^\[|TPOT|error|Error"; log "$1 $4 done"; }
V mini10 profile-mini10.json full_residency,lru,oled,ideal,naive_lru,fiddler,tide 40
V mini10 profile-mini10.json full_residency,lru,oled,ideal,fiddler,naive_lru 100
