#!/usr/bin/env bash
# Would a second engine process per GPU raise the flat-out words? Two engines alone (recipes/engine_flat_out.py:
# no websockets, front ends or clients), each with half the streams, flat out on the one GPU at the same time.
# One engine's words are bounded by its interpreter's host work a job (docs/benchmarks.md, "Overlapped jobs"); if
# the two together write nearly twice what one writes, an engine process per share of the GPU is the way past
# that bound. check.sh runs it (BUDGET_TWO_ENGINES); on the CPU it runs too (DEVICE=cpu), which says little there.
#
#   bash recipes/gpu/two_engines.sh [OUTDIR]        # STREAMS in all (default 1024), half each
set -uo pipefail
cd "$(dirname "$0")/../.."
DIR="${1:-${OUT:-.}}"; mkdir -p "$DIR"
PY="${PY:-python3}"; DATA="${DATA:-.gpu/data}"; CKPT="${CKPT:-gma_delta1}"; DEVICE="${DEVICE:-cuda}"
STEP="${STEP:-graphs-encoder}"; STREAMS="${STREAMS:-1024}"; SECONDS_TIMED="${SECONDS_TIMED:-15}"
WARM="${WARM:-6}"   # a long warm-up: both are loaded and capturing before either's timed window starts
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null' EXIT
for i in 1 2; do
  "$PY" recipes/engine_flat_out.py --device "$DEVICE" --step "$STEP" -m "$CKPT" --source "$DATA/test.de" \
    --streams $((STREAMS / 2)) --max-batch 256 --warm-seconds "$WARM" --seconds "$SECONDS_TIMED" \
    --json "$DIR/two_engines_$i.json" > "$DIR/two_engines_$i.txt" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
pids=()
for i in 1 2; do echo "engine $i of 2, $((STREAMS / 2)) streams:"; sed -n '2,5p' "$DIR/two_engines_$i.txt"; done
"$PY" - "$DIR" <<'PYEOF'
import json, sys
runs = [json.load(open(f"{sys.argv[1]}/two_engines_{i}.json")) for i in (1, 2)]
each = [r["words_per_s"] for r in runs]
print(f"together: {sum(each):.0f} target words/s ({each[0]:.0f} + {each[1]:.0f})")
PYEOF
exit $rc
