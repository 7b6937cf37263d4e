#!/usr/bin/env bash
# Would a second engine process per GPU pay? Two independent servers (each with the server's defaults, so on
# CUDA the graphs step and 4 front ends) on the one GPU, each driven by its own `bench server --url` with half
# the speakers, at the same time: if each half stays real time where one server with all the speakers does
# not, the interpreter of the one engine process is the limit (docs/benchmarks.md, "Third measurement").
# check.sh runs it; on the CPU it runs too (DEVICE=cpu), which says little: two engines share 2 cores there.
#
#   bash recipes/gpu/two_servers.sh [OUTDIR]        # LEVELS are per server (default 500,1000: 1,000 and 2,000 in all)
set -uo pipefail
cd "$(dirname "$0")/../.."
DIR="${1:-${OUT:-.}}"; mkdir -p "$DIR"
DATA="${DATA:-.gpu/data}"; CKPT="${CKPT:-gma_delta1}"; DEVICE="${DEVICE:-cuda}"
LEVELS="${TWO_LEVELS:-500,1000}"; CLIENT_PROCS="${CLIENT_PROCS:-8}"
most=$(tr ',' '\n' <<< "$LEVELS" | sort -n | tail -1)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null' EXIT   # gone before the next part starts
for port in 8101 8102; do
  simulserve serve bench="$CKPT" --device "$DEVICE" --host 127.0.0.1 --port $port --max-streams $((most + 8)) \
    --no-admission --max-connections-per-ip 0 --idle-timeout 3600 --log-level warning > "$DIR/server_$port.log" 2>&1 &
  pids+=($!)
done
for port in 8101 8102; do   # ready once its graphs are captured
  for _ in $(seq 600); do
    python3 -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:$port/health').status != 200)" 2>/dev/null && break
    sleep 0.5
  done
done
benches=()
for port in 8101 8102; do
  simulserve bench server --url ws://127.0.0.1:$port/v1/stream --model bench --input "$DATA/test.de" --levels "$LEVELS" \
    --level-seconds 10 --skip throughput,soak --client-procs $((CLIENT_PROCS / 2)) > "$DIR/bench_$port.log" 2>&1 &
  benches+=($!)
done
wait "${benches[@]}"
for port in 8101 8102; do
  echo "server on port $port, half the speakers (every level: the two servers at the same time):"
  grep -E "^\| (streams|---|[0-9]+ \|)" "$DIR/bench_$port.log" | cut -d'|' -f2,7-14,17
done
