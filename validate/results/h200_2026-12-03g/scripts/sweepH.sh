# next lease, call H: GPU tests; mini profile; OLED/ideal at Cache 20/40/100 and LRU/full residency at 40, 3 repeats each
source .val/common3.sh
timeout 120 python -m pytest -q -m gpu tests/ > .val/sweep3/gpu_tests.txt 2>&1; log "gpu tests rc=$?"; tail -2 .val/sweep3/gpu_tests.txt
[ -f .val/sweep3/profile-mini.json ] || { timeout 150 python -m hwprofile --model mini --out .val/sweep3/profile-mini.json > .val/sweep3/prof_mini.txt 2>&1; log "prof mini rc=$?"; }
W() { R=$(rem); [ $R -gt 30 ] || { log "skip $1 $2"; return; }; timeout $R python -m validate quiet=true validate.repeats=3 hydra.run.dir=.val/sweep3/mini hw.profile=.val/sweep3/profile-mini.json "validate.caches=[$2]" "validate.policies=[$1]" 2>&1 | grep -v Warning | tee -a .val/sweep3/mini_c$2.txt | grep -E "^\[|TPOT|rror"; log "mini $1 $2 rc=$?"; }
W full_residency,lru,oled,ideal 40
W oled,ideal 20
W oled,ideal 100
W tide 40
