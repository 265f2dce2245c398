# next lease, call J: the end-to-end mode on the H200 (never run there yet): train the small-mini model
# briefly, then decode 2 HumanEval prompts under each policy with experts offloaded; lossless vs full residency
source .val/common3.sh
[ -d .val/sweep3/run/checkpoint ] || { timeout 200 python -m traces.train --out .val/sweep3/run --jsonl .data/gsm8k_train.jsonl --budget-s 120 --quiet > .val/sweep3/train.txt 2>&1; log "train rc=$?"; tail -3 .val/sweep3/train.txt; }
R=$(rem); timeout $R python -m validate.e2e --checkpoint .val/sweep3/run/checkpoint --humaneval --limit 2 --max-new-tokens 32 \
    --policies naive_lru,lru,lfu,ktransformers,fiddler,tide,oled --cache 40 --out .val/sweep3/e2e 2>&1 | grep -v Warning | tee .val/sweep3/e2e.txt | tail -15; log "e2e rc=$?"
