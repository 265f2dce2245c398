#!/usr/bin/env bash
# Train the small LLaDA2-topology model, then collect and characterise real traces with it.
#   bash src/dllm_offload_sim/models/llada2/train/real_traces.sh OUT_DIR [DATA_DIR]
# DATA_DIR holds gsm8k_train.jsonl and gsm8k_test.jsonl (default .data). Knobs (environment):
# BUDGET_S training seconds (270), STEPS optimiser steps instead (a run's schedule exactly, whatever the GPU's speed),
# REQUESTS prompts per dataset (48), NEW_TOKENS per request (128),
# COLLECT_MIN minutes per dataset at most (2.5), BATCH prompts decoded in lockstep (1),
# PRESET model size (small-mini), TRAIN_ARGS more dllm-train arguments (e.g. "--compile --batch 256"),
# B32_MIN minutes for the block-32 GSM8K collection (1; 0 skips it). Writes OUT_DIR/run (checkpoint, loss curve,
# samples), OUT_DIR/traces/{humaneval,gsm8k}_b16 and gsm8k_b32 (the block-length figure), and
# OUT_DIR/stats/<trace>/ (summary.json, tables, plots; for block 16, compare.csv: the new trace beside the shipped
# one of the same prompts, and which is closer to LLaDA2.0's behaviour).
set -euo pipefail
OUT=${1:?usage: real_traces.sh OUT_DIR [DATA_DIR]}
DATA=${2:-.data}
BUDGET_S=${BUDGET_S:-270}; REQUESTS=${REQUESTS:-48}; NEW_TOKENS=${NEW_TOKENS:-128}; COLLECT_MIN=${COLLECT_MIN:-2.5}
PRESET=${PRESET:-small-mini}  # tiny: a smoke run of the whole pipeline on a CPU
BATCH=${BATCH:-1}
B32_MIN=${B32_MIN:-1}
mkdir -p "$OUT/stats"
dllm-train --out "$OUT/run" --jsonl "$DATA/gsm8k_train.jsonl" --sample-prompts "$DATA/gsm8k_test.jsonl" \
    $([ -n "${STEPS:-}" ] && echo "--steps $STEPS" || echo "--budget-s $BUDGET_S") --preset "$PRESET" --quiet ${TRAIN_ARGS:-}
shape=(--shape mini); [ "$PRESET" = tiny ] && shape=()  # tiny has 32 experts: record its own sizes
common=(--checkpoint "$OUT/run/checkpoint" "${shape[@]}" --threshold 0.9 --max-new-tokens "$NEW_TOKENS"
        --limit "$REQUESTS" --batch-size "$BATCH" --quiet --overwrite)
gsm8k=(--prompts "$DATA/gsm8k_test.jsonl" --field question --template 'Question: {}\nAnswer:' --dataset gsm8k)
dllm-trace-collect "${common[@]}" --block-length 16 --max-minutes "$COLLECT_MIN" --humaneval --out "$OUT/traces/humaneval_b16"
dllm-trace-collect "${common[@]}" --block-length 16 --max-minutes "$COLLECT_MIN" "${gsm8k[@]}" --out "$OUT/traces/gsm8k_b16"
if [ "$B32_MIN" != 0 ]; then
    dllm-trace-collect "${common[@]}" --block-length 32 --max-minutes "$B32_MIN" "${gsm8k[@]}" --out "$OUT/traces/gsm8k_b32"
    dllm-stats "$OUT/traces/gsm8k_b32" --quiet --out "$OUT/stats/gsm8k_b32" --compare "$OUT/traces/gsm8k_b16" \
        > "$OUT/stats/gsm8k_b32.txt"
fi
for t in humaneval_b16 gsm8k_b16; do  # beside the shipped trace of the same prompts: which is closer to LLaDA2.0
    dllm-stats "$OUT/traces/$t" --quiet --out "$OUT/stats/$t" --compare "llada2_small_$t" > "$OUT/stats/$t.txt"
done
