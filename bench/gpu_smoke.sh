#!/usr/bin/env bash
# GPU smoke, at most 10 minutes on one H100/H200-class GPU: a random 0.5B-class Qwen3 policy; one
# train step in bf16 on a 32k-token packed tree with FlexAttention (FSDP over the GPUs present when
# there are several); the vLLM engine sampling, reloading the trained weights and sampling again;
# the train–inference mismatch of both batches. Prints one table (stages: bench/gpu_smoke.py).
#
#   bash bench/gpu_smoke.sh                      # on the GPU machine
#   GPU_SMOKE_DRY=1 bash bench/gpu_smoke.sh      # tiny sizes on the CPU: segments attention, hf engine
#
# Settings (environment):
#   GPU_SMOKE_ATTENTION  tree attention of the train step; default `auto`: the mask_mod FlexAttention
#                        option where this checkout has one, else `flex` (block mask from a dense mask).
#                        An option this checkout lacks, or flex without CUDA, falls back with a row
#                        saying so.
#   GPU_SMOKE_ENGINE     serving engine (default vllm; hf in a dry run)
#   GPU_SMOKE_GPUS       processes of the train step (default: the GPUs present; 1 in a dry run)
#   GPU_SMOKE_PYTHON     Python of the engine stage (e.g. a venv with vLLM; default python3)
#   GPU_SMOKE_WORK       working folder (default: a fresh temporary one, removed at the end)
#   GPU_SMOKE_TIMEOUT    seconds for the whole smoke (default 600)
set -uo pipefail

cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
PY=python3
ENGINE_PY=${GPU_SMOKE_PYTHON:-python3}
DRY=${GPU_SMOKE_DRY:-0}
ATTENTION=${GPU_SMOKE_ATTENTION:-auto}
WORK=${GPU_SMOKE_WORK:-}
if [[ -z "$WORK" ]]; then
  WORK=$(mktemp -d -t clawgym-gpu-smoke-XXXXXX)
  trap 'rm -rf "$WORK"' EXIT
fi
DEADLINE=$(( $(date +%s) + ${GPU_SMOKE_TIMEOUT:-600} ))

if [[ "$DRY" == 1 ]]; then
  ENGINE=${GPU_SMOKE_ENGINE:-hf}
  GPUS=${GPU_SMOKE_GPUS:-1}
  SIZES=(--dry --tree-tokens 512 --prompts 2 --prompt-tokens 32 --new-tokens 8)
else
  ENGINE=${GPU_SMOKE_ENGINE:-vllm}
  GPUS=${GPU_SMOKE_GPUS:-$($PY -c 'import torch; print(torch.cuda.device_count())')}
  SIZES=()
  if [[ "$GPUS" -lt 1 ]]; then
    echo "gpu_smoke: no CUDA GPU visible (set GPU_SMOKE_DRY=1 for the CPU dry run)" >&2
    exit 2
  fi
fi

# every stage gets what is left of the overall budget; a stage that fails leaves its row and the rest still run
stage() {
  local left=$(( DEADLINE - $(date +%s) ))
  if (( left <= 0 )); then
    echo "{\"stage\": \"$2\", \"status\": \"FAILED\", \"detail\": \"not started: the ${GPU_SMOKE_TIMEOUT:-600}s budget ran out\", \"seconds\": 0}" >> "$WORK/rows.jsonl"
    return 1
  fi
  timeout --kill-after=10 "$left" "${@:3}" || { local rc=$?; if (( rc == 124 || rc == 137 )); then
    echo "{\"stage\": \"$2\", \"status\": \"FAILED\", \"detail\": \"timed out (budget left: ${left}s)\", \"seconds\": $left}" >> "$WORK/rows.jsonl"; fi; return 1; }
}

ok=0
stage "$PY" model "$PY" bench/gpu_smoke.py model --work "$WORK" "${SIZES[@]}" || ok=1
if (( ok == 0 )); then
  if (( GPUS > 1 )); then
    stage "$PY" train "$PY" -m torch.distributed.run --standalone --nproc_per_node "$GPUS" bench/gpu_smoke.py train \
      --work "$WORK" --attention "$ATTENTION" "${SIZES[@]}" || ok=1
  else
    stage "$PY" train "$PY" bench/gpu_smoke.py train --work "$WORK" --attention "$ATTENTION" "${SIZES[@]}" || ok=1
  fi
fi
if (( ok == 0 )); then
  stage "$ENGINE_PY" engine "$ENGINE_PY" bench/gpu_smoke.py engine --work "$WORK" --engine "$ENGINE" "${SIZES[@]}" || ok=1
fi
"$PY" bench/gpu_smoke.py report --work "$WORK" $([[ "$DRY" == 1 ]] && echo --dry) || ok=1
exit $ok
