#!/usr/bin/env bash
# The De→En results of docs/results.md: the shipped checkpoints on the six test sets, the BLEU–AL plots
# and two GMA alignment pictures.
#
#   bash recipes/results.sh [OUT]        # default OUT=docs/results; LIMIT=N sentences per test set
#                                        # (default: all 5,005, 1,317 of them the unseen set; the time
#                                        # the five older sets took is in docs/results.md)
#
# Needs `simulserve prepare-data --out data/de-en-everyday --vocab-from models/checkpoints/gma_delta1`
# first (the test sets; the Bible, DDTP and LibreOffice ones are byte-identical to those of
# `prepare-data --out data/de-en`; `unseen` is held out of all training, docs/data.md) and the shipped
# models. DATA=... and SETS=... pick others.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-docs/results}"
LIMIT="${LIMIT:-100000}"
SIMULSERVE="${SIMULSERVE:-.venv/bin/simulserve}"

DATA="${DATA:-data/de-en-everyday}"
SETS="${SETS:-everyday,unseen,dialogue,bible,ddtp,libreoffice}"
PARTS="${PARTS:-runs/results_parts}"
COMMON=(--data "$DATA" --sets "$SETS" --limit "$LIMIT" --batch-size 32 --threads 1 --quiet)
# GMA: the δ=1 model at δ = 0.5, 1 and 2 (the δ=2 model is no longer shipped); wait-k at k = 1..9 (one multipath model);
# offline greedy and beam 5. Five parts in two queues side by side, one thread each (how the figures in
# docs/results.md were made), each into its own directory; merged with the rules of --append.
rm -rf "$PARTS"
{
  "$SIMULSERVE" evaluate -m offline --label offline "${COMMON[@]}" -o "$PARTS/offline"
  "$SIMULSERVE" evaluate -m offline --label "offline, beam 5" --beam 5 "${COMMON[@]}" -o "$PARTS/offline_beam"
} & first=$!
{
  "$SIMULSERVE" evaluate -m gma_delta1 --label "GMA, trained δ=1" --delta 0.5,1,2 "${COMMON[@]}" -o "$PARTS/gma_delta1"
  "$SIMULSERVE" evaluate -m waitk --label wait-k --k 1,3,5,7,9 "${COMMON[@]}" -o "$PARTS/waitk"
} & second=$!
wait "$first"; wait "$second"   # set -e: a failed part stops here
rm -rf "$OUT/outputs"
.venv/bin/python recipes/merge_results.py "$OUT" "$PARTS"/{gma_delta1,waitk,offline,offline_beam}

# one test-set verse and one everyday sentence of the caption page's demo text: cross-attention of every
# decoder layer, GMA's p_i and the READ/WRITE path
"$SIMULSERVE" plot-alignment -m gma_delta1 --layer all \
  -s "So nehmet nun aus den Stämmen Israels zwölf Männer, aus jedem Stamm einen." \
  -o "$OUT/alignment_gma_delta1.png" --json "$OUT/alignment_gma_delta1.json"
"$SIMULSERVE" plot-alignment -m gma_delta1 --layer all \
  -s "Wir treffen uns morgen um acht Uhr am Bahnhof." \
  -o "$OUT/alignment_gma_delta1_everyday.png" --json "$OUT/alignment_gma_delta1_everyday.json"

# the three targets of the issue, from the numbers above
.venv/bin/python recipes/targets.py "$OUT/results.json" | tee "$OUT/targets.txt"
.venv/bin/python recipes/results_tables.py "$OUT/results.json" > "$OUT/tables.md"
