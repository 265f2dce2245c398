#!/usr/bin/env bash
# The whole validation on a GPU host, into OUT: GPU tests, the replay-path diagnostics
# (bench/bench_replay_paths.py), profiles of this machine, the replay sweep at
# mini shapes (validate.policies x Cache 20/40/100) and at flash shapes (Cache 40/100), the fidelity
# figure; with a checkpoint (CKPT=dir) also the end-to-end mode on HumanEval prompts.
#   bash validate/validate_all.sh OUT
# Re-running into the same OUT resumes: finished (policy, cache) runs under OUT/mini/runs, OUT/flash/runs are kept.
# Knobs (environment): PROFILE=1 re-profiles this machine first (else the shipped H200 profiles are used),
# CPU_THREADS=N profiles (and so replays) the CPU experts with N intra-op threads (default: torch's),
# REPEATS=N replays each run N times (measured = the median repeat, the range kept; default 1),
# CKPT (a LLaDA2 checkpoint for the end-to-end mode), E2E_PROMPTS (4), E2E_TOKENS (64).
set -euo pipefail
OUT=${1:?usage: validate_all.sh OUT}
mkdir -p "$OUT"
python -m pytest -q -m gpu tests/test_runtime_gpu.py 2>&1 | tee "$OUT/gpu_tests.txt"
python bench/bench_replay_paths.py --json "$OUT/replay_paths.json" 2>&1 | tee "$OUT/replay_paths.txt"
prof_mini=() prof_flash=() threads=()
[ -n "${CPU_THREADS:-}" ] && threads=(--cpu-threads "$CPU_THREADS")
if [ "${PROFILE:-0}" = 1 ]; then
    dllm-profile --model mini "${threads[@]}" --out "$OUT/profile-mini.json"
    dllm-profile --model flash "${threads[@]}" --out "$OUT/profile-flash.json"
    prof_mini=("hw.profile=$OUT/profile-mini.json") prof_flash=("hw.profile=$OUT/profile-flash.json")
fi
dllm-validate quiet=true "hydra.run.dir=$OUT/mini" "validate.repeats=${REPEATS:-1}" "${prof_mini[@]}" 2>&1 | tee "$OUT/mini.txt"
dllm-synth --model flash --n-requests 1 --max-new-tokens 128 --out "$OUT/flash_b16" --quiet --overwrite
DLLM_FLASH_TRACE="$OUT/flash_b16" dllm-validate experiment=validate_flash quiet=true "hydra.run.dir=$OUT/flash" \
    "validate.repeats=${REPEATS:-1}" "${prof_flash[@]}" 2>&1 | tee "$OUT/flash.txt"
dllm-fidelity-figure "$OUT/mini" "$OUT/flash" --out "$OUT/fidelity"
dllm-report "$OUT/mini" "$OUT/flash" --out "$OUT/fidelity.md"
if [ -n "${CKPT:-}" ]; then
    dllm-e2e --checkpoint "$CKPT" --humaneval --limit "${E2E_PROMPTS:-4}" \
        --max-new-tokens "${E2E_TOKENS:-64}" --out "$OUT/e2e" --quiet 2>&1 | tee "$OUT/e2e.txt"
fi
