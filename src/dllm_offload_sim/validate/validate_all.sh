#!/usr/bin/env bash
# The whole validation on a GPU host, into OUT, run from the repository root:
#   bash src/dllm_offload_sim/validate/validate_all.sh OUT
# Steps, in order (STEPS=a,b,... runs only those; each resumes where it can):
#   tests    the GPU tests (runtime primitives, CPU engines)
#   bench    the CPU engines against the weight-streaming bound, and where the replay's host time goes
#   profile  profiles of this machine (mini, flash) with the CPU engine CPU_ENGINE
#   hostwork the replay's host work per MoE layer (bench/bench_host_work.py) against OUT/profile-mini.json, or the
#            shipped H200 profile without one
#   mini     the replay sweep at mini shapes: validate.policies x validate.caches
#   flash    the replay sweep at flash shapes on a generated trace (experiment=validate_flash)
#   timeline (not in the default) OLED, clairvoyant_coop and KTransformers at mini Cache 40 and 100 with
#            validate.layer_timeline=true, into OUT/timeline: where a cooperative layer's time goes, layer by layer
#   flashtimeline (not in the default) the same three at flash shapes, Cache 40, into OUT/flash_timeline
#   figure   the fidelity figure and report over what mini and flash have so far
#   e2e      with a checkpoint (CKPT=dir): the end-to-end mode on HumanEval prompts
# Re-running into the same OUT resumes: finished (policy, cache) runs under OUT/mini/runs, OUT/flash/runs are kept
# (and the finished repeats of a run cut off: a sweep replays its repeats in rounds across its runs),
# and an existing OUT/profile-*.json is reused (delete it to re-profile).
# Knobs (environment): STEPS (default every step but e2e without CKPT), CPU_ENGINE=auto|kt|torch (default auto: kt
# where kt-kernel is installed), CPU_THREADS=N (the engine's threads), CPU_ORDERING=stream|host|direct (how the kt
# engine's calls are ordered with the GPU, default stream), REPEATS=N (replays per run, default 3),
# PROFILE_MODELS (the models the profile step measures, default "mini flash"; about 3 min each on the H200 host),
# CKPT, E2E_PROMPTS (4), E2E_TOKENS (64), VALIDATE_ARGS (more overrides for the mini and flash sweeps, e.g.
# "validate.caches=[40,100]" to run part of a sweep in a shorter allocation: split by cache, docs/validation.md),
# BUDGET_S (seconds this call may take: each command runs under what is left of it and is interrupted (SIGINT) when
# it runs out, and the steps after it are skipped; a sweep cut off keeps its finished runs and repeats, and the next
# call into the same OUT resumes it; a profile cut off writes no file).
# Within one allocation cut into shorter commands, run the whole sweep in each: it resumes mid-round, so each run's
# repeats spread over the commands. Without the profile step the shipped H200 profiles are used.
set -euo pipefail
OUT=${1:?usage: validate_all.sh OUT}
STEPS=${STEPS:-tests,bench,profile,hostwork,mini,flash,figure,e2e}
mkdir -p "$OUT"
has() { [[ ",$STEPS," == *",$1,"* ]]; }
start=$SECONDS
budgeted() {  # "$@" under what is left of BUDGET_S (unbounded without it); a command the budget stops is not an error
    [ -z "${BUDGET_S:-}" ] && { "$@"; return; }
    local left=$(( BUDGET_S - (SECONDS - start) )) rc=0
    if [ "$left" -le 0 ]; then
        echo "validate_all: the budget of ${BUDGET_S} s is spent; skipped: $*" >&2
        return 0
    fi
    timeout --signal=INT --kill-after=30 "$left" "$@" || rc=$?
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "validate_all: stopped at the budget of ${BUDGET_S} s: $* (rerun into the same OUT to resume)" >&2
        return 0
    fi
    return "$rc"
}
engine=(--cpu-engine "${CPU_ENGINE:-auto}") threads=() ordering=(--cpu-ordering "${CPU_ORDERING:-stream}")
[ -n "${CPU_THREADS:-}" ] && threads=(--cpu-threads "$CPU_THREADS")
if has tests; then
    budgeted python -m pytest -q -m gpu tests/test_runtime_gpu.py tests/test_cpu_engine.py 2>&1 | tee "$OUT/gpu_tests.txt"
fi
if has bench; then
    # the native engine in its three orderings where it runs here (CPU_ENGINE=torch: the reference)
    bench_engines=$(python -c "from dllm_offload_sim.runtime.cpu_engine import kt_kernel_variant as v
print('kt-stream,kt-host,kt-direct' if v() and '${CPU_ENGINE:-auto}' != 'torch' else 'torch')")
    budgeted python bench/bench_cpu_engine.py --engines "$bench_engines" "${threads[@]}" --json "$OUT/cpu_engine.json" 2>&1 \
        | tee "$OUT/cpu_engine.txt"
    budgeted python bench/bench_replay_paths.py --json "$OUT/replay_paths.json" 2>&1 | tee "$OUT/replay_paths.txt"
fi
if has profile; then
    for m in ${PROFILE_MODELS:-mini flash}; do
        [ -f "$OUT/profile-$m.json" ] || budgeted dllm-profile --model "$m" "${engine[@]}" "${ordering[@]}" "${threads[@]}" --out "$OUT/profile-$m.json"
    done
fi
extra=()
[ -n "${VALIDATE_ARGS:-}" ] && read -r -a extra <<< "$VALIDATE_ARGS"
prof_mini=() prof_flash=()
[ -f "$OUT/profile-mini.json" ] && prof_mini=("hw.profile=$OUT/profile-mini.json")
[ -f "$OUT/profile-flash.json" ] && prof_flash=("hw.profile=$OUT/profile-flash.json")
if has hostwork; then
    hw_prof=h200-mini; [ -f "$OUT/profile-mini.json" ] && hw_prof="$OUT/profile-mini.json"
    budgeted python bench/bench_host_work.py --profile "$hw_prof" --json "$OUT/host_work.json" 2>&1 | tee "$OUT/host_work.txt"
fi
if has mini; then
    budgeted dllm-validate quiet=true "hydra.run.dir=$OUT/mini" "validate.repeats=${REPEATS:-3}" "${prof_mini[@]}" \
        "${extra[@]}" 2>&1 | tee -a "$OUT/mini.txt"
fi
if has flash; then
    [ -d "$OUT/flash_b16" ] || budgeted dllm-synth --model flash --n-requests 1 --max-new-tokens 128 --out "$OUT/flash_b16" --quiet
    DLLM_FLASH_TRACE="$OUT/flash_b16" budgeted dllm-validate experiment=validate_flash quiet=true "hydra.run.dir=$OUT/flash" \
        "validate.repeats=${REPEATS:-3}" "${prof_flash[@]}" "${extra[@]}" 2>&1 | tee -a "$OUT/flash.txt"
fi
if has timeline; then
    budgeted dllm-validate quiet=true "hydra.run.dir=$OUT/timeline" "validate.repeats=${REPEATS:-3}" \
        'validate.policies=[oled,clairvoyant_coop,ktransformers]' 'validate.caches=[40,100]' \
        validate.layer_timeline=true "${prof_mini[@]}" "${extra[@]}" 2>&1 | tee -a "$OUT/timeline.txt"
    budgeted dllm-report "$OUT/timeline" --out "$OUT/timeline.md"
fi
if has flashtimeline; then
    [ -d "$OUT/flash_b16" ] || budgeted dllm-synth --model flash --n-requests 1 --max-new-tokens 128 --out "$OUT/flash_b16" --quiet
    DLLM_FLASH_TRACE="$OUT/flash_b16" budgeted dllm-validate experiment=validate_flash quiet=true \
        "hydra.run.dir=$OUT/flash_timeline" "validate.repeats=${REPEATS:-3}" \
        'validate.policies=[oled,clairvoyant_coop,ktransformers]' 'validate.caches=[40]' \
        validate.layer_timeline=true "${prof_flash[@]}" "${extra[@]}" 2>&1 | tee -a "$OUT/flash_timeline.txt"
    budgeted dllm-report "$OUT/flash_timeline" --out "$OUT/flash_timeline.md"
fi
if has figure; then
    dirs=()
    for d in mini flash; do [ -f "$OUT/$d/fidelity.parquet" ] && dirs+=("$OUT/$d"); done
    if [ ${#dirs[@]} -gt 0 ]; then
        budgeted dllm-fidelity-figure "${dirs[@]}" --out "$OUT/fidelity"
        budgeted dllm-report "${dirs[@]}" --out "$OUT/fidelity.md"
    fi
fi
if has e2e && [ -n "${CKPT:-}" ]; then
    budgeted dllm-e2e --checkpoint "$CKPT" --humaneval --limit "${E2E_PROMPTS:-4}" --max-new-tokens "${E2E_TOKENS:-64}" \
        "${engine[@]}" "${threads[@]}" --out "$OUT/e2e" --quiet 2>&1 | tee "$OUT/e2e.txt"
fi
