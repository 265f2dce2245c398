# next session, call D: GPU tests; profile mini (now with runtime.cpu_stall_per_copy_s); the CPU-path
# policies and the GPU-path references at Cache 40, 20, 100 into .val/sweep2/mini (resumable)
source .val/common.sh
mkdir -p .val/sweep2
timeout 120 python -m pytest -q -m gpu tests/ > .val/sweep2/gpu_tests.txt 2>&1; log "gpu tests rc=$?"; tail -2 .val/sweep2/gpu_tests.txt
[ -f .val/sweep2/profile-mini.json ] || { timeout 150 python -m hwprofile --model mini --out .val/sweep2/profile-mini.json > .val/sweep2/prof_mini.txt 2>&1; log "prof mini rc=$?"; }
python -c "import json; p=json.load(open('.val/sweep2/profile-mini.json')); print('runtime', p.get('runtime'))"
W() { R=$(rem); [ $R -gt 30 ] || { log "skip $2"; return; }; timeout $R python -m validate quiet=true hydra.run.dir=.val/sweep2/mini hw.profile=.val/sweep2/profile-mini.json "validate.caches=[$2]" "validate.policies=[$1]" 2>&1 | grep -v Warning | tee -a .val/sweep2/mini_c$2.txt | grep -E "^\[|TPOT|rror"; log "mini $1 $2 rc=$?"; }
W oled,ideal,full_residency,lru 40
W oled,ideal 20
W oled,ideal 100
W tide,ktransformers 40
