# sourced by the sweep calls: install the carried wheels, time guard, pack .val into $OUT on exit
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit 1
S=$SECONDS; END=${END:-540}; log() { echo "[$(date +%T) +$((SECONDS-S))s] $*" | tee -a .val/sweep/times.txt; }
pack() { tar czf "$OUT/val.tgz" .val/sweep; }; trap pack EXIT
rem() { echo $((END - (SECONDS-S))); }
P10=full_residency,lru,naive_lru,fiddler,moe_infinity,finemoe,oled,ideal,tide,ktransformers
V() { R=$(rem); [ $R -gt 30 ] || { log "skip $1 $2"; return; }; timeout $R python -m validate quiet=true hydra.run.dir=.val/sweep/$1 hw.profile=.val/sweep/profile-$1.json "validate.caches=[$2]" "validate.policies=[${3:-$P10}]" 2>&1 | grep -v Warning | tee -a .val/sweep/$1_c$2.txt | grep -E "^\[|TPOT|rror"; log "$1 $2 rc=$?"; }
