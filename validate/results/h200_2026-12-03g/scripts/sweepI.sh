# next lease, call I: flash profile; flash OLED/ideal at Cache 40 and 100, LRU at 100, 3 repeats each
source .val/common3.sh
[ -f .val/sweep3/profile-flash.json ] || { timeout 240 python -m hwprofile --model flash --out .val/sweep3/profile-flash.json > .val/sweep3/prof_flash.txt 2>&1; log "prof flash rc=$?"; }
export DLLM_FLASH_TRACE=.val/sweep/flash_b16
F() { R=$(rem); [ $R -gt 30 ] || { log "skip flash $1"; return; }; timeout $R python -m validate experiment=validate_flash quiet=true validate.repeats=3 hydra.run.dir=.val/sweep3/flash hw.profile=.val/sweep3/profile-flash.json "validate.caches=[$1]" "validate.policies=[$2]" 2>&1 | grep -v Warning | tee -a .val/sweep3/flash_c$1.txt | grep -E "^\[|TPOT|rror"; log "flash $1 rc=$?"; }
F 100 lru,oled,ideal
F 40 oled,ideal
