source .val/common.sh
W() { R=$(rem); [ $R -gt 30 ] || { log "skip $2"; return; }; timeout $R python -m validate quiet=true hydra.run.dir=.val/sweep2/mini_t14_rep hw.profile=.val/sweep2/profile-mini-t14.json "validate.caches=[$2]" "validate.policies=[$1]" 2>&1 | grep -v Warning | tee -a .val/sweep2/mini_t14rep_c$2.txt | grep -E "^\[|TPOT|rror"; log "mini t14 rep $1 $2 rc=$?"; }
W oled,ideal,full_residency 100
W oled 40
