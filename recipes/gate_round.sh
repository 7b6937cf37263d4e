#!/usr/bin/env bash
# The shipping gate of a fine-tune round (issue 28; docs/training.md): the candidate checkpoint evaluated
# with the default decoding at the settings results.sh reports for its policy (GMA: δ = 1 and δ = 0.5, 2;
# wait-k: k = 1, 3, 5 and 7, 9; offline: greedy and beam 5) on all six test sets (two runs side by side, one
# thread each, about 5 min on the 2-core machine for GMA), the rows concatenated, then
# recipes/round_gate.py against the published rows.
#
#   bash recipes/gate_round.sh CHECKPOINT OUT [BASELINE]   # BASELINE default docs/results/results.csv
#   BASE_OUTPUTS=runs/results_r8 bash recipes/gate_round.sh ...  # + paired bootstrap p-values against the
#                                          # per-sentence outputs of the baseline's own gate run
#
# e.g. bash recipes/gate_round.sh runs/everyday9_gma_delta1/checkpoint runs/results_r9
# The candidate is evaluated under the shipped model's name (gma_delta1, waitk or offline; NAME=... for another).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then sed -n '2,13p' "$0"; exit 2; fi
CKPT="$1"; OUT="$2"; BASELINE="${3:-docs/results/results.csv}"
S="${SIMULSERVE:-.venv/bin/simulserve}"
C=(--data "${DATA:-data/de-en-everyday}" --sets everyday,unseen,dialogue,bible,ddtp,libreoffice --batch-size 32
   --threads 1 --quiet)
# the settings results.sh measures for the checkpoint's policy (its config.json), in two parts side by side
ATTENTION=$("${PY:-.venv/bin/python}" -c 'import sys; from models.checkpoint import read_config
from models.shipped import resolve_checkpoint
print(read_config(resolve_checkpoint(sys.argv[1]))[0].attention)' "$CKPT")
# the candidate runs under the shipped model's name (NAME= to change it), so its rows and output files pair
# with the shipped model's runs, wherever its checkpoint lies
case "$ATTENTION" in
  gma) SHIPPED=gma_delta1; P1=gma_d1; A1=(--label "GMA, trained δ=1" --delta 1); P2=gma_d05_2; A2=(--label "GMA, trained δ=1" --delta 0.5,2) ;;
  waitk) SHIPPED=waitk; P1=waitk_k135; A1=(--label wait-k --k 1,3,5); P2=waitk_k79; A2=(--label wait-k --k 7,9) ;;
  standard) SHIPPED=offline; P1=offline; A1=(--label offline); P2=offline_beam; A2=(--label "offline, beam 5" --beam 5) ;;
  *) echo "gate_round.sh: no gate for attention '$ATTENTION' (gma, waitk, standard)"; exit 2 ;;
esac
N=(--name "${NAME:-$SHIPPED}")
"$S" evaluate -m "$CKPT" "${N[@]}" "${A1[@]}" "${C[@]}" -o "$OUT/$P1" & first=$!
"$S" evaluate -m "$CKPT" "${N[@]}" "${A2[@]}" "${C[@]}" -o "$OUT/$P2" & second=$!
wait "$first"; wait "$second"   # set -e: a failed run stops here
{ cat "$OUT/$P1/results.csv"; tail -n +2 "$OUT/$P2/results.csv"; } > "$OUT/gate.csv"
SIG=(); [ -n "${BASE_OUTPUTS:-}" ] && SIG=(--outputs "$BASE_OUTPUTS" "$OUT")
"${PY:-.venv/bin/python}" recipes/round_gate.py "$BASELINE" "$OUT/gate.csv" "${SIG[@]}" | tee "$OUT/gate.md"
