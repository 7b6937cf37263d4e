#!/usr/bin/env bash
# Early EOS on all six test sets with the shipped weights (issue 28, part 3; docs/results.md, "Decoding
# options"): wait-k k = 1..3 and GMA δ = 1 with `--early-eos read` (the default) and `write`, then the table.
#
#   bash recipes/early_eos.sh [RUNS] [OUT]   # default RUNS=runs/eos, OUT=docs/results/decoding
#
# Four evaluate runs at one thread (about 25 min on the 2-core machine beside other work). Needs the test
# sets of `simulserve prepare-data --out data/de-en-everyday --vocab-from models/checkpoints/gma_delta1`.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${1:-runs/eos}"
OUT="${2:-docs/results/decoding}"
S="${SIMULSERVE:-.venv/bin/simulserve}"
C=(--data "${DATA:-data/de-en-everyday}" --sets everyday,unseen,dialogue,bible,ddtp,libreoffice --batch-size 32
   --threads 1 --quiet)
for eos in read write; do
  "$S" evaluate -m waitk --label wait-k --k 1,2,3 "${C[@]}" --early-eos "$eos" -o "$RUNS/waitk_$eos"
  "$S" evaluate -m gma_delta1 --label "GMA, trained δ=1" --delta 1 "${C[@]}" --early-eos "$eos" -o "$RUNS/gma_$eos"
done
mkdir -p "$OUT"
"${PY:-.venv/bin/python}" recipes/decoding_table.py "$RUNS/waitk_read,$RUNS/gma_read" "$RUNS/waitk_write" \
  "$RUNS/gma_write" > "$OUT/early_eos8.md"
