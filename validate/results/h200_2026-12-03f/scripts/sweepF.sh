# call F: the CPU executor with 14 intra-op threads (2 of 16 cores left to the main thread and the driver):
# profile mini at 14 threads, then the CPU-path policies at Cache 40/20 into .val/sweep2/mini_t14
source .val/common.sh
[ -f .val/sweep2/profile-mini-t14.json ] || { timeout 150 python -m hwprofile --model mini --cpu-threads 14 --out .val/sweep2/profile-mini-t14.json > .val/sweep2/prof_mini_t14.txt 2>&1; log "prof mini t14 rc=$?"; }
python -c "import json; p=json.load(open('.val/sweep2/profile-mini-t14.json')); print('runtime', p.get('runtime'), p['cpu_expert'])"
W() { R=$(rem); [ $R -gt 30 ] || { log "skip $2"; return; }; timeout $R python -m validate quiet=true hydra.run.dir=.val/sweep2/mini_t14 hw.profile=.val/sweep2/profile-mini-t14.json "validate.caches=[$2]" "validate.policies=[$1]" 2>&1 | grep -v Warning | tee -a .val/sweep2/mini_t14_c$2.txt | grep -E "^\[|TPOT|rror"; log "mini t14 $1 $2 rc=$?"; }
W oled,ideal,lru 40
W oled,ideal 20
W tide,ktransformers 40
W oled,ideal 100
