#!/usr/bin/env bash
# Issue 13, part 3: sequence-level distillation for the GMA student, beside the arms of run.sh (same data,
# same starting weights, same 300-update budget). The shipped offline model translates the conversational
# sources' training German with beam 5; the other sources keep their human pairs.
#   E  GMA continued 300 updates on the teacher's English (arm A's recipe, --data data/de-en-distilled)
#   F  the same with the teacher's and the human English (--data data/de-en-distilled-refs)
# then both on the same test sentences as run.sh and the matched-AL table with arms A-D (their figures from
# runs/gma_init/eval_* when run.sh ran here, else the committed docs/results/gma_init/results.csv).
#
#   bash recipes/gma_init/distill.sh        # NICE=19 to yield
set -euo pipefail
cd "$(dirname "$0")/../.."
source recipes/gma_init/common.sh
CONVERSATIONAL=auf-deutsch,freedroid,hedgewars,wesnoth
"${N[@]}" .venv/bin/python -m models.data.distill --teacher offline --data "$DATA" \
  --out data/de-en-distilled --sources "$CONVERSATIONAL" --keep-other-sources --beam 5 --batch-size 32 \
  --threads 2 --no-progress | tee "$OUT/distill.log"
mkdir -p data/de-en-distilled-refs                       # the same teacher outputs, references added
cp data/de-en-distilled/distill.*.en data/de-en-distilled-refs/
"${N[@]}" .venv/bin/python -m models.data.distill --teacher offline --data "$DATA" \
  --out data/de-en-distilled-refs --sources "$CONVERSATIONAL" --keep-other-sources --with-references \
  --beam 5 --no-progress | tee -a "$OUT/distill.log"
train distilled continue --data data/de-en-distilled & a=$!
train distilled_refs continue --data data/de-en-distilled-refs & b=$!
wait "$a"; wait "$b"
"${N[@]}" "$SIMULSERVE" evaluate -m "$OUT/distilled/checkpoint" --label "E: GMA distilled" \
  -m "$OUT/distilled_refs/checkpoint" --label "F: GMA distilled + references" --delta 0.5,1,2 \
  --data "$DATA" --sets everyday,dialogue,bible,ddtp,libreoffice --limit "$LIMIT" \
  --batch-size 32 --threads 2 --quiet -o "$OUT/eval_ef"
EARLIER=("$OUT"/eval_{ab,c,d}/results.json)
[ -f "${EARLIER[0]}" ] || EARLIER=(docs/results/gma_init/results.csv)
.venv/bin/python recipes/gma_init/table.py "${EARLIER[@]}" "$OUT/eval_ef/results.json" | tee "$OUT/table_all.md"
