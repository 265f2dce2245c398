# next session, call E: flash at Cache 100 (the arena fix), flash TIDE/KTransformers at 40, the rest of mini
source .val/common.sh
mkdir -p .val/sweep2
[ -f .val/sweep2/profile-flash.json ] || { timeout 240 python -m hwprofile --model flash --out .val/sweep2/profile-flash.json > .val/sweep2/prof_flash.txt 2>&1; log "prof flash rc=$?"; }
export DLLM_FLASH_TRACE=.val/sweep/flash_b16
F() { R=$(rem); [ $R -gt 30 ] || { log "skip flash $1"; return; }; timeout $R python -m validate experiment=validate_flash quiet=true hydra.run.dir=.val/sweep2/flash hw.profile=.val/sweep2/profile-flash.json "validate.caches=[$1]" "validate.policies=[$2]" 2>&1 | grep -v Warning | tee -a .val/sweep2/flash_c$1.txt | grep -E "^\[|TPOT|rror"; log "flash $1 rc=$?"; }
F 100 lru,naive_lru,oled,ideal,fiddler,moe_infinity,finemoe
F 40 oled,ideal,tide,ktransformers
