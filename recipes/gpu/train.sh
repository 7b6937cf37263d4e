#!/usr/bin/env bash
# GPU training in resumable commands that each end inside the GPU machine's 10-minute limit (issue 27):
#
#   bash recipes/gpu/train.sh RECIPE [MINUTES]     # e.g. recipes/gma_delta1.yaml 8
#
# The recipe's `gpu:` section applies (its batch size and schedule: the run trains on CUDA). Needs the
# training data packed beside the tree (`bash recipes/gpu/pack.sh train` and, for a bare image, `pack.sh
# check`: carry `.gpu`). Each command trains for MINUTES (default 8) and then:
#   - the full training state (weights, Adam moments, data position, RNG) stays in $STATE on the machine,
#     so the next command on the same machine resumes exactly where this one stopped;
#   - the fp16 checkpoint (config.json, model.safetensors <= 16 MiB, spm.model) and the logs land in
#     $OUT/NAME, small enough to come back.
# If the machine was given back between two commands its state is gone: copy the last checkpoint that
# came back to .gpu/resume/NAME and carry it; the run then starts from those weights (--init-from) with a
# fresh optimizer and says so. DEVICE=cpu runs the same on a CPU (a dry run: tests/test_gpu_scripts.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
RECIPE="${1:?usage: train.sh RECIPE [MINUTES]}"
MINUTES="${2:-8}"
NAME="$(basename "$RECIPE" .yaml)"
DEVICE="${DEVICE:-cuda}"
DATA="${DATA:-/tmp/simulserve-data}"
STATE="${STATE:-${STATE_ROOT:-/tmp/simulserve-train}/$NAME}"
DEST="${OUT:-runs/gpu}/$NAME"
LIMIT_MB=16
RESUME="${RESUME:-.gpu/resume/$NAME}"
. recipes/gpu/env.sh

if [ ! -f "$DATA/spm.model" ]; then
  [ -f .gpu/train.tar.xz ] || { echo "no $DATA and no .gpu/train.tar.xz: bash recipes/gpu/pack.sh train"; exit 2; }
  mkdir -p "$DATA" && tar -xJf .gpu/train.tar.xz -C "$DATA"
fi
args=(--data "$DATA" --output "$STATE" --device "$DEVICE" --max-minutes "$MINUTES" --no-progress)
if [ -f "$STATE/train_state/state.json" ]; then
  echo "resuming $STATE"
elif [ -f "$RESUME/model.safetensors" ]; then
  echo "no training state on this machine: starting from the carried weights $RESUME (fresh optimizer)"
  args+=(--init-from "$RESUME")
fi
start=$SECONDS
"$PY" -m clients.cli train "$RECIPE" "${args[@]}"
mkdir -p "$DEST"
cp "$STATE"/checkpoint/* "$DEST"/
for f in log.jsonl updates.jsonl; do [ -f "$STATE/$f" ] && cp "$STATE/$f" "$DEST/"; done
"$PY" - "$STATE" <<'PY' | tee "$DEST/progress.txt"
import json, sys
state = json.load(open(f"{sys.argv[1]}/train_state/state.json"))
print(f"step {state.get('step')} epoch {state.get('epoch')}")
PY
for f in "$DEST"/*; do
  size=$(stat -c %s "$f")
  if [ "$size" -gt $((LIMIT_MB * 1048576)) ]; then
    echo "$f is $((size / 1048576)) MiB, over the ${LIMIT_MB} MiB a file that comes back may have"; exit 3
  fi
done
echo "checkpoint in $DEST after $((SECONDS - start)) s"
