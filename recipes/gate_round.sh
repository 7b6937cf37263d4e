#!/usr/bin/env bash
# The shipping gate of a fine-tune round (issue 28; docs/training.md): the candidate checkpoint evaluated
# with the default decoding at δ = 1 and at δ = 0.5, 2 on all six test sets (two runs side by side, one
# thread each, about 5 min on the 2-core machine), the rows concatenated, then recipes/round_gate.py
# against the published rows.
#
#   bash recipes/gate_round.sh CHECKPOINT OUT [BASELINE]   # BASELINE default docs/results/results.csv
#   BASE_OUTPUTS=runs/results_r8 bash recipes/gate_round.sh ...  # + paired bootstrap p-values against the
#                                          # per-sentence outputs of the baseline's own gate run
#
# e.g. bash recipes/gate_round.sh runs/everyday9_gma_delta1/checkpoint runs/results_r9
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then sed -n '2,11p' "$0"; exit 2; fi
CKPT="$1"; OUT="$2"; BASELINE="${3:-docs/results/results.csv}"
S="${SIMULSERVE:-.venv/bin/simulserve}"
C=(--data "${DATA:-data/de-en-everyday}" --sets everyday,unseen,dialogue,bible,ddtp,libreoffice --batch-size 32
   --threads 1 --quiet)
"$S" evaluate -m "$CKPT" --label "GMA, trained δ=1" --delta 1 "${C[@]}" -o "$OUT/gma_d1" & first=$!
"$S" evaluate -m "$CKPT" --label "GMA, trained δ=1" --delta 0.5,2 "${C[@]}" -o "$OUT/gma_d05_2" & second=$!
wait "$first"; wait "$second"   # set -e: a failed run stops here
{ cat "$OUT/gma_d1/results.csv"; tail -n +2 "$OUT/gma_d05_2/results.csv"; } > "$OUT/gate.csv"
SIG=(); [ -n "${BASE_OUTPUTS:-}" ] && SIG=(--outputs "$BASE_OUTPUTS" "$OUT")
"${PY:-.venv/bin/python}" recipes/round_gate.py "$BASELINE" "$OUT/gate.csv" "${SIG[@]}" | tee "$OUT/gate.md"
