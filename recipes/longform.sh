#!/usr/bin/env bash
# The long-form table of docs/evaluation.md: every talk (a whole Bible chapter, LibreOffice help page or game
# dialogue file of at least 100 words) of the bible, libreoffice and dialogue test sets streamed word by word
# at 150 words a minute with no sentence ends, for GMA δ=1, wait-k k=3 and k=5 and offline, each with the
# segmenters below; per-sentence figures of the same sentences beside them.
#
#   bash recipes/longform.sh [OUT]       # default OUT=runs/longform; TALKS=N: the first N talks per set
#
# Needs a `prepare-data` directory written by this version (it has the SPLIT.NAME.docs files):
#   simulserve prepare-data --out data/de-en-everyday --vocab-from models/checkpoints/gma_delta1
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-runs/longform}"
SIMULSERVE="${SIMULSERVE:-.venv/bin/simulserve}"
PYTHON="${PYTHON:-.venv/bin/python}"
DATA="${DATA:-data/de-en-everyday}"
SETS="${SETS:-bible,libreoffice,dialogue}"
SEGMENTERS="${SEGMENTERS:-punct,punct+max:30,oracle}"
COMMON=(--data "$DATA" --sets "$SETS" --long-form --segmenter "$SEGMENTERS" --wpm 150 --batch-size 32
        --threads 1 --quiet ${TALKS:+--talks "$TALKS"})
# two queues side by side, one thread each (how the figures in docs/evaluation.md were made)
"$SIMULSERVE" evaluate -m gma_delta1 --label "GMA δ=1" --delta 1 "${COMMON[@]}" -o "$OUT/gma_delta1" & first=$!
{
  "$SIMULSERVE" evaluate -m waitk --label wait-k --k 3,5 "${COMMON[@]}" -o "$OUT/waitk"
  "$SIMULSERVE" evaluate -m offline --label offline "${COMMON[@]}" -o "$OUT/offline"
} & second=$!
wait "$first"; wait "$second"   # set -e: a failed part stops here
"$PYTHON" recipes/longform_table.py "$OUT"/{gma_delta1,waitk,offline}/longform.json
