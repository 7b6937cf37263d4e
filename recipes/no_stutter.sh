#!/usr/bin/env bash
# The no-stutter rule on the full test sets (issue 28; docs/results.md, "Decoding options"): the shipped
# models without it (--no-stutter 0) and with it (--no-stutter N, default 12), then the table.
#
#   bash recipes/no_stutter.sh [RUNS] [OUT] [N]   # default RUNS=runs/stutter, OUT=docs/results/decoding, N=12
#
# Six evaluate runs one after the other at one thread (about 50 min on the 2-core machine while a training
# run used the other core). Needs the test sets of
# `simulserve prepare-data --out data/de-en-everyday --vocab-from models/checkpoints/gma_delta1`.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${1:-runs/stutter}"
OUT="${2:-docs/results/decoding}"
N="${3:-12}"
S="${SIMULSERVE:-.venv/bin/simulserve}"
C=(--data "${DATA:-data/de-en-everyday}" --sets everyday,unseen,dialogue,bible,ddtp,libreoffice --batch-size 32
   --threads 1 --quiet)
for n in "$N" 0; do
  "$S" evaluate -m gma_delta1 --label "GMA, trained δ=1" --delta 0.5,1,2 "${C[@]}" --no-stutter "$n" -o "$RUNS/gma_$n"
  "$S" evaluate -m waitk --label wait-k --k 1,3,5 "${C[@]}" --no-stutter "$n" -o "$RUNS/waitk_$n"
  "$S" evaluate -m offline --label offline "${C[@]}" --no-stutter "$n" -o "$RUNS/offline_$n"
done
mkdir -p "$OUT"
"${PY:-.venv/bin/python}" recipes/decoding_table.py "$RUNS/gma_0,$RUNS/waitk_0,$RUNS/offline_0" \
  "$RUNS/gma_$N" "$RUNS/waitk_$N" "$RUNS/offline_$N" > "$OUT/no_stutter$N.md"
