# call C: the rest of mini at Cache 20, then flash: profile, Cache 40 and 100 (full residency, ~200 GB of experts, does not fit one H200)
source .val/common.sh
[ -f .val/sweep/profile-flash.json ] || { timeout 240 python -m hwprofile --model flash --out .val/sweep/profile-flash.json > .val/sweep/prof_flash.txt 2>&1; log "prof flash rc=$?"; }
export DLLM_FLASH_TRACE=.val/sweep/flash_b16
F() { R=$(rem); [ $R -gt 30 ] || { log "skip flash $1"; return; }; timeout $R python -m validate experiment=validate_flash quiet=true hydra.run.dir=.val/sweep/flash hw.profile=.val/sweep/profile-flash.json "validate.caches=[$1]" "validate.policies=[$2]" 2>&1 | grep -v Warning | tee -a .val/sweep/flash_c$1.txt | grep -E "^\[|TPOT|rror"; log "flash $1 rc=$?"; }
F 40 lru,naive_lru,oled,ideal,fiddler
F 100 lru,naive_lru,oled,ideal,fiddler
F 40 moe_infinity,finemoe,tide,ktransformers
F 100 moe_infinity,finemoe,tide,ktransformers
