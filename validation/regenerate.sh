#!/usr/bin/env bash
# The current validation claims, predicted again by the current simulator from the stored measurements (no GPU):
#   bash validation/regenerate.sh
# For each host kind, each sweep's stored runs (fidelity.parquet: what the GPU measured) are re-predicted with
# the profile they were validated against (dllm-repredict), then reported (dllm-report -> fidelity.md) and drawn
# (dllm-fidelity-figure -> fidelity.png/.pdf). New measurements come from a GPU host:
#   bash src/dllm_offload_sim/validate/validate_all.sh OUT     (docs/validation.md: running a validation)
# and replace a sweep's folder here (fidelity.parquet, fidelity_forwards.parquet, .hydra/, profile.json).
set -euo pipefail
cd "$(dirname "$0")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# the flash sweep replayed a generated trace (validate_all.sh's flash step): the same generator, the same trace
dllm-synth --model flash --n-requests 1 --max-new-tokens 128 --out "$work/flash_b16" --quiet
mkdir -p h100/current
dllm-repredict h100/mini --profile h100/mini/profile.json --out h100/current/mini.parquet
dllm-repredict h100/flash --profile h100/flash/profile.json --trace "$work/flash_b16" --out h100/current/flash.parquet
dllm-report h100/current/mini.parquet h100/current/flash.parquet --profile h100/mini/profile.json --out h100/fidelity.md
dllm-fidelity-figure h100/current/mini.parquet h100/current/flash.parquet --out h100/fidelity
cp h100/fidelity.png ../docs/img/fidelity_h100.png   # the figure docs/validation.md shows
