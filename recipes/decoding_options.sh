#!/usr/bin/env bash
# Repetition control and early EOS on the full test sets (issue 28; docs/results.md, "Decoding options"):
# the shipped models without and with each decoding option, then the tables.
#
#   bash recipes/decoding_options.sh [RUNS] [OUT]     # default RUNS=runs/rep, OUT=docs/results/decoding
#
# Eight evaluate runs one after the other at one thread (about 75 min on the 2-core machine while
# other work ran). Needs the test sets of
# `simulserve prepare-data --out data/de-en-everyday --vocab-from models/checkpoints/gma_delta1`.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${1:-runs/rep}"
OUT="${2:-docs/results/decoding}"
S="${SIMULSERVE:-.venv/bin/simulserve}"
C=(--data "${DATA:-data/de-en-everyday}" --sets everyday,dialogue,bible,ddtp,libreoffice --batch-size 32 --threads 1 --quiet)
"$S" evaluate -m gma_delta1 --label GMA --delta 1 "${C[@]}" -o "$RUNS/base_gma"
"$S" evaluate -m waitk --label wait-k --k 1,2,3,5 "${C[@]}" -o "$RUNS/base_waitk"
"$S" evaluate -m gma_delta1 --label GMA --delta 1 "${C[@]}" --early-eos write -o "$RUNS/eos_gma"
"$S" evaluate -m waitk --label wait-k --k 1,2,3 "${C[@]}" --early-eos write -o "$RUNS/eos_waitk"
"$S" evaluate -m gma_delta1 --label GMA --delta 1 "${C[@]}" --no-repeat-ngram 4 -o "$RUNS/nr4_gma"
"$S" evaluate -m waitk --label wait-k --k 3,5 "${C[@]}" --no-repeat-ngram 4 -o "$RUNS/nr4_waitk"
"$S" evaluate -m offline --label offline "${C[@]}" --no-repeat-ngram 4 -o "$RUNS/nr4_offline"
"$S" evaluate -m offline --label offline "${C[@]}" -o "$RUNS/base_offline"
mkdir -p "$OUT"
PY="${PY:-.venv/bin/python}"
"$PY" recipes/decoding_table.py "$RUNS/base_gma,$RUNS/base_waitk" "$RUNS/eos_gma" "$RUNS/eos_waitk" > "$OUT/early_eos.md"
"$PY" recipes/decoding_table.py "$RUNS/base_gma,$RUNS/base_waitk,$RUNS/base_offline" \
  "$RUNS/nr4_gma" "$RUNS/nr4_waitk" "$RUNS/nr4_offline" > "$OUT/no_repeat_ngram4.md"
