#!/usr/bin/env bash
# Issue 13, part 3: what initialising GMA from multipath wait-k weights, and a δ curriculum, do at equal
# budgets. Four arms, each 300 updates of the everyday mix from the weights of commit 66f7e6b (3,263
# updates on Bible, help and descriptions):
#   A continue.yaml    GMA δ=1 from the GMA weights (the control)
#   B continue.yaml    GMA δ=1 from the multipath wait-k weights (--init-from; GMA's step predictors start fresh)
#   C curriculum.yaml  as A, δ falling 4 -> 1 over the first 200 updates
#   D waitk.yaml       multipath wait-k from the wait-k weights (wait-k's curve at the same budget)
# then every arm on the first LIMIT sentences of the five test sets, GMA at δ = 0.5, 1, 2 and wait-k at
# k = 1, 3, 5, 7, and the table at matched AL (recipes/gma_init/table.py).
#
#   bash recipes/gma_init/run.sh        # needs .venv; prepares data/de-en-gma-init; NICE=19 to yield
set -euo pipefail
cd "$(dirname "$0")/../.."
source recipes/gma_init/common.sh
{ train continue continue; train curriculum curriculum; } & a=$!
{ train from_waitk continue --init-from "$OUT/base_waitk"; train waitk waitk; } & b=$!
wait "$a"; wait "$b"
COMMON=(--data "$DATA" --sets everyday,dialogue,bible,ddtp,libreoffice --limit "$LIMIT"
        --batch-size 32 --threads 1 --quiet)
"${N[@]}" "$SIMULSERVE" evaluate -m "$OUT/continue/checkpoint" --label "A: GMA continued" \
  -m "$OUT/from_waitk/checkpoint" --label "B: GMA from wait-k" --delta 0.5,1,2 "${COMMON[@]}" -o "$OUT/eval_ab" &
"${N[@]}" "$SIMULSERVE" evaluate -m "$OUT/curriculum/checkpoint" --label "C: GMA δ curriculum" \
  --delta 0.5,1,2 "${COMMON[@]}" -o "$OUT/eval_c" &
wait
"${N[@]}" "$SIMULSERVE" evaluate -m "$OUT/waitk/checkpoint" --label "D: wait-k continued" --k 1,3,5,7 \
  "${COMMON[@]}" -o "$OUT/eval_d"
.venv/bin/python recipes/gma_init/table.py "$OUT"/eval_{ab,c,d}/results.json | tee "$OUT/table.md"
