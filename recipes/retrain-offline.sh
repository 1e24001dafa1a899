#!/usr/bin/env bash
# recipes/retrain-offline.sh — retrain from a finished run's saved trees, changing only what you name:
# environment variables over `clawgym replay RUN [OUT] [KEY=VALUE ...]`, which is the command itself.
#
# A run keeps every step's batch (step-NNNN/{rollouts,trees}.parquet) and the train settings each
# step used (checkpoints/step-NNNN/train_config.json), so the optimizer can be replayed without a
# single rollout: this script trains a fresh copy of the run's starting policy over the same
# batches, step after step, with every setting the run recorded (algo, epochs, minibatches, seeds,
# value model, ...) except those you change, then prints the run's and the replay's training figures
# side by side. It works on `clawgym run`'s run folders and recipes/pipeline.sh's alike.
#
#     bash recipes/pipeline.sh                                  # a finished run (recipes/runs/pipeline)
#     LR=0.01 bash recipes/retrain-offline.sh                   # → recipes/runs/pipeline-lr0.01
#     FROM=recipes/runs/quickstart bash recipes/retrain-offline.sh algo=ppo minibatches=4
#
# Without LR, ALGO or KEY=VALUE arguments the replay changes nothing and writes the run's
# checkpoints again (to float tolerance): step k starts from the replay's step k − 1, optimizer
# moments and PPO value model included, as the run's did. With a change, the batches were still
# sampled by the run's policies, so the replay is off-policy: its |Δlogp| to the sampling engine
# grows with the difference, and truncated importance sampling (train `tis`) bounds its effect.
# Rerunning resumes.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
FROM="${FROM:-$HERE/runs/pipeline}"   # the finished run (pipeline.sh's or `clawgym run`'s)
LR="${LR:-}"                          # a learning rate to try instead of the run's (lr=...)
ALGO="${ALGO:-}"                      # an algorithm to try instead of the run's (algo=...)
MODEL="${MODEL:-}"                    # a starting policy instead of the one the run's step 1 started from
OUT="${OUT:-}"                        # where the replay writes; default FROM-lr0.01 (FROM-replay: no change)

# Every change is a KEY=VALUE train setting (`clawgym train --help` names them): LR and ALGO are two.
changes=()
[ -z "$LR" ] || changes+=("lr=$LR")
[ -z "$ALGO" ] || changes+=("algo=$ALGO")
args=("$FROM")
[ -z "$OUT" ] || args+=("$OUT")
[ -z "$MODEL" ] || args+=(--model "$MODEL")

# `clawgym replay` prints one line saying what it changes, trains each saved step (progress on
# stderr), then the comparison table.
exec clawgym replay "${args[@]}" "${changes[@]}" "$@"
