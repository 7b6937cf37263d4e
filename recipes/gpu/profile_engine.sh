#!/usr/bin/env bash
# Where the process that steps the models spends its time while `bench server` holds a level (the server's
# defaults): py-spy samples it (every thread, without pausing it) and recipes/profile_summary.py prints the
# tables. check.sh runs it on the GPU; it runs on the CPU too (DEVICE=cpu):
#
#   bash recipes/gpu/profile_engine.sh [OUTDIR]     # OUTDIR/engine_profile.txt (raw py-spy), the tables on stdout
#
# PROFILE_SPEAKERS=N (default 1000) speakers at 150 wpm, or PROFILE_SPEAKERS=flat: the throughput phase,
# THROUGHPUT_STREAMS (default 1024) streams sending whole sentences as fast as they are served
#
# With front ends in processes of their own (CUDA: --workers auto = 4) the profiled process is the engine
# process; in one process it is the server itself.
set -uo pipefail
cd "$(dirname "$0")/../.."
DIR="${1:-${OUT:-.}}"; mkdir -p "$DIR"
PY="${PY:-python3}"; DATA="${DATA:-.gpu/data}"; CKPT="${CKPT:-gma_delta1}"; DEVICE="${DEVICE:-cuda}"
SPEAKERS="${PROFILE_SPEAKERS:-1000}"; SECONDS_PROFILED="${PROFILE_SECONDS:-15}"; CLIENT_PROCS="${CLIENT_PROCS:-8}"
command -v py-spy >/dev/null || { echo "profile_engine.sh: no py-spy (pack.sh check carries its wheel)"; exit 2; }
log="$DIR/profile_bench.log"
if [ "$SPEAKERS" = flat ]; then
  phase=(--skip ramp,soak --throughput-streams "${THROUGHPUT_STREAMS:-1024}" --throughput-seconds $((SECONDS_PROFILED + 10)))
  started="throughput at"
else
  phase=(--levels "$SPEAKERS" --level-seconds $((SECONDS_PROFILED + 10)) --skip throughput,soak)
  started="real-time ramp"
fi
simulserve bench server --device $DEVICE --no-admission --checkpoint "$CKPT" --input "$DATA/test.de" \
  "${phase[@]}" --client-procs "$CLIENT_PROCS" > "$log" 2>&1 &
bench=$!
trap 'kill "$bench" 2>/dev/null' EXIT   # cut off by a budget: the benchmark stops its server
pid=""
for _ in $(seq 600); do   # until the level starts (the server loads, warms up and captures first)
  if grep -q "$started" "$log"; then
    pid=$(sed -n 's/.*engine process pid \([0-9]*\).*/\1/p' "$log" | head -1)
    [ -n "$pid" ] || pid=$(pgrep -f "clients.cli serve bench=" | head -1)
    break
  fi
  kill -0 "$bench" 2>/dev/null || break
  sleep 0.5
done
[ -n "$pid" ] || { echo "profile_engine.sh: the benchmark's server did not start"; tail -n 20 "$log"; exit 1; }
sleep 5   # past the connection burst, which the benchmark does not count either
py-spy record -d "$SECONDS_PROFILED" -r 100 --threads --nonblocking -f raw -o "$DIR/engine_profile.txt" --pid "$pid" \
  > "$DIR/py-spy.log" 2>&1 || { echo "py-spy failed:"; cat "$DIR/py-spy.log"; }
wait "$bench"
grep -E "^server CPU|^\| (streams|engine|---|[0-9]+ \||batched)" "$log" | head -4
echo
"$PY" recipes/profile_summary.py "$DIR/engine_profile.txt" --top 20
