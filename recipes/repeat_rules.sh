#!/usr/bin/env bash
# Repeats anywhere in a sentence (issue 28, part 2): GMA δ = 1 with the no-stutter rule (N = 12) plus
# --no-repeat-ngram N for N = 4, 6, 8, on all six sets, against the no-stutter runs of recipes/no_stutter.sh
# (run that first: its RUNS/gma_12 is the stutter-only baseline, RUNS/gma_0 the model without any rule).
#
#   bash recipes/repeat_rules.sh [RUNS] [OUT]   # default RUNS=runs/stutter, OUT=docs/results/decoding
#
# Three evaluate runs at one thread, about 4 min each on the 2-core machine beside a training run.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${1:-runs/stutter}"
OUT="${2:-docs/results/decoding}"
S="${SIMULSERVE:-.venv/bin/simulserve}"
PY="${PY:-.venv/bin/python}"
C=(--data "${DATA:-data/de-en-everyday}" --sets everyday,unseen,dialogue,bible,ddtp,libreoffice --batch-size 32
   --threads 1 --quiet)
for n in 4 6 8; do
  "$S" evaluate -m gma_delta1 --label "GMA, trained δ=1" --delta 1 "${C[@]}" --no-stutter 12 --no-repeat-ngram "$n" \
    -o "$RUNS/gma_12_nr$n"
done
mkdir -p "$OUT"
{
  for n in 4 6 8; do
    echo "### --no-repeat-ngram $n on top of the no-stutter rule (before: no-stutter alone)"
    echo
    "$PY" recipes/decoding_table.py "$RUNS/gma_12" "$RUNS/gma_12_nr$n"
    echo
  done
  echo "### Both rules (no-stutter 12, no-repeat-ngram 4) against no rule at all"
  echo
  "$PY" recipes/decoding_table.py "$RUNS/gma_0" "$RUNS/gma_12_nr4"
} > "$OUT/no_repeat_on_stutter.md"
