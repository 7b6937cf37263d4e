#!/usr/bin/env bash
# The GPU check: on a machine with a CUDA GPU, the tree and `.gpu/` (from
# `bash recipes/gpu/pack.sh check`, run where pip reaches the index), one command installs what the
# image lacks, runs every CUDA test and every benchmark of docs/benchmarks.md's GPU section, and writes
# all tables to one file:
#
#   bash recipes/gpu/check.sh [REPORT]          # default REPORT: ${OUT:-.}/gpu_check.md
#
# Each step has its own time budget (BUDGET_* below, seconds) and a step that runs out is reported as
# such, so one slow part cannot cost the rest. JSON of every benchmark lands beside REPORT. By default it
# answers within 9 minutes of budgets: the CUDA-graph equivalence tests (graph replay = eager = CPU, one per policy),
# bench step (wall against kernel per batch size, eager sync-free against graphs and graphs-encoder), bench
# server with the server's defaults (graphs-encoder, front ends in processes of their own) without admission
# from 1,000 to 4,000 speakers and flat out at 1,024 streams, the engine alone flat out at 1,024 streams (no
# websockets: which side loses the words), the same with --overlap off, and a py-spy profile of the engine process flat
# out (PROFILE_SPEAKERS=1000: at 1,000 speakers instead); SM utilisation sampled through each server run. Off
# unless given a budget: parts measured already (the server with --step graphs, the decoder alone captured,
# BUDGET_SERVER_DECODER=110; the same server in one process, BUDGET_SERVER_ONE=100; admission past capacity,
# BUDGET_ADMISSION=120; two servers sharing the GPU, BUDGET_TWO=90) and the older ones (bfloat16, bench
# engine, graph breaks of the compiled form, evaluate: BUDGET_STEP_BF16=50 and so on).
#
# QUICK=1: the parts the issue's targets need, within 5 minutes of device time with the machine's start: the
# graph-replay tests against eager and the CPU, bench step with the default form (small and large batches), the
# server's defaults at 1,000 and 4,000 speakers and flat out; no engine-alone run, no profile. FLAT_OUT=1 (with
# QUICK or without) adds what the flat-out target needs to know: the engine alone flat out with the default and
# with --overlap off, the server with --overlap off at NO_OVERLAP_LEVELS and flat out, and the server with
# --engines ENGINES (1: the A/B against the defaults' two engine processes) at ENGINES_LEVELS and flat out (230 s). Its budgets come
# from the H200 at d0771c7, where QUICK's earlier budgets cut three parts: the 20 graph tests took about 110 s,
# bench step with three forms over 35 s a size (graphs-encoder alone 20 and 31 s), three ramp levels and the
# flat-out rows over 110 s. PLAN=1: print each part and its budget, and their sum, and run nothing.
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ "${FLAT_OUT:-0}" = 1 ]; then   # the flat-out experiments, QUICK or not (a value given explicitly still wins)
  : "${BUDGET_ENGINE_FLAT:=35}" "${BUDGET_ENGINE_NO_OVERLAP:=35}" "${BUDGET_SERVER_NO_OVERLAP:=60}"
  : "${BUDGET_SERVER_ENGINES:=100}"
fi
if [ "${QUICK:-0}" = 1 ]; then
  : "${BUDGET_TESTS:=45}" "${TESTS_K:=replay_equals and not fused}" "${BUDGET_STEP:=75}" "${STEP_PATHS:=graphs-encoder}"
  : "${SERVER_LEVELS:=1000,4000}" "${BUDGET_SERVER:=120}" "${BUDGET_ENGINE_FLAT:=0}" "${BUDGET_PROFILE:=0}"
  : "${BUDGET_ENGINE_NO_OVERLAP:=0}"
fi
PLAN="${PLAN:-0}"
DIR="${OUT:-.}"
REPORT="${1:-$DIR/gpu_check.md}"
DIR="$(dirname "$REPORT")"
[ "$PLAN" = 1 ] || mkdir -p "$DIR"
PY="${PY:-python3}"
DATA="${DATA:-.gpu/data}"
CKPT="${CKPT:-gma_delta1}"
DEVICE="${DEVICE:-cuda}"   # DEVICE=cpu: a dry run of this script where there is no GPU
BUDGET_TESTS="${BUDGET_TESTS:-120}"   # all 20 cases of tests/test_cuda_graphs.py: about 110 s on an H200
BUDGET_STEP="${BUDGET_STEP:-130}"     # halved between the small and the large batches
# the step forms bench step compares: eager sync-free and the two graph forms (QUICK: the default form alone)
STEP_PATHS="${STEP_PATHS:-sync-free,graphs,graphs-encoder}"
BUDGET_STEP_BF16="${BUDGET_STEP_BF16:-0}"
# the graphs-fused form (its two steps and the settling of a trial compiled by inductor, then captured): its replay
# tests (compiling is most of it, 14 variants a model; not yet run on a GPU: 150 to start with; FUSED_K picks the
# cases, e.g. "replay_equals and fused and gma" for one policy) and bench step against graphs-encoder at SMALL_BATCHES
BUDGET_FUSED_TESTS="${BUDGET_FUSED_TESTS:-0}"
FUSED_K="${FUSED_K:-replay_equals and fused}"
BUDGET_STEP_FUSED="${BUDGET_STEP_FUSED:-0}"
# bench step with overlapped steps (--arrivals overlapped: two lockstep groups, one's step launched before the other's
# is collected, as the server's jobs on a GPU): the stepping loop's wall per step against the same kernels, at
# SMALL_BATCHES over twice SMALL_SENTENCES and at STEP_BATCHES over twice STEP_SENTENCES, forms OVERLAP_PATHS;
# a third to the small batches (few steps) and the rest to the large; 120 runs it (not yet run on a GPU)
BUDGET_STEP_OVERLAP="${BUDGET_STEP_OVERLAP:-0}"
# the host's floor a step: recipes/host_python.py --bodies recorded on CUDA (the timed rounds launch no graph: the
# host's Python and its CUDA calls outside the graphs), a third at SMALL_BATCHES lockstep over SMALL_SENTENCES and
# the rest at STEP_BATCHES with STEP_ARRIVALS over STEP_SENTENCES; 60 runs it (not yet run on a GPU)
BUDGET_HOST_FLOOR="${BUDGET_HOST_FLOOR:-0}"
BUDGET_STEP_TRACE="${BUDGET_STEP_TRACE:-0}"   # recipes/gpu/step_trace.py at SMALL_BATCHES: traces and the gaps per step; 40 runs it
BUDGET_ENGINE="${BUDGET_ENGINE:-0}"
BUDGET_SERVER="${BUDGET_SERVER:-150}"
BUDGET_GRAPHS="${BUDGET_GRAPHS:-0}"
BUDGET_EVAL="${BUDGET_EVAL:-0}"
SERVER_LEVELS="${SERVER_LEVELS:-1000,1250,1500,1750,2000,4000}"; CLIENT_PROCS="${CLIENT_PROCS:-8}"
EVAL_LIMIT="${EVAL_LIMIT:-200}"
# bench step's size: the full sizes take about 18 s per timed run on an H200 (30 runs in float32), more than
# a time-boxed run's check has; run_boxed.sh asks for fewer sentences, batch sizes and rounds
STEP_BATCHES="${STEP_BATCHES:-64,256}"; STEP_SENTENCES="${STEP_SENTENCES:-256}"; STEP_ROUNDS="${STEP_ROUNDS:-1}"
# the large batches' words arrive out of phase, as in a server (most steps encode: what graphs-encoder is for);
# STEP_ARRIVALS=lockstep repeats the earlier reports' setting
STEP_ARRIVALS="${STEP_ARRIVALS:-staggered}"
BF16_BATCHES="${BF16_BATCHES:-1,8,32,128}"; BF16_SENTENCES="${BF16_SENTENCES:-128}"
TESTS_K="${TESTS_K:-}"   # pytest -k: run_boxed.sh runs only the tests that use CUDA (70 s ran 20 of all 64 on an H200)
# the graph-replay tests only by default: the compiled form's CUDA tests (tests/test_device_state.py) compile
# for minutes (TEST_FILES="tests/test_cuda_graphs.py tests/test_device_state.py" runs them too)
TEST_FILES="${TEST_FILES:-tests/test_cuda_graphs.py}"
# bench step in two sizes: batch 1 and 8 over few sentences (a step at a time is slow to walk through many: 32
# sentences did not finish in 40 s on the H200), 64 and 256 over enough sentences to fill them (37 s there)
SMALL_BATCHES="${SMALL_BATCHES:-1,8}"; SMALL_SENTENCES="${SMALL_SENTENCES:-8}"
SMALL_ROUNDS="${SMALL_ROUNDS:-$STEP_ROUNDS}"   # (one round of batch 8 read 1.97x and three 1.60x on one H200)
BUDGET_PROFILE="${BUDGET_PROFILE:-70}"
BUDGET_ENGINE_FLAT="${BUDGET_ENGINE_FLAT:-35}"   # recipes/engine_flat_out.py: load, capture, 3 s warm, 15 s timed (28 s on the H200)
BUDGET_ENGINE_SWITCH="${BUDGET_ENGINE_SWITCH:-0}"   # the same at a 0.5 ms switch interval; 35 runs it (28 s on the H200)
BUDGET_ENGINE_NO_YIELD="${BUDGET_ENGINE_NO_YIELD:-0}"   # the same without the hand-over after each job; 35 runs it
BUDGET_ENGINE_BATCH512="${BUDGET_ENGINE_BATCH512:-0}"   # the same with jobs of up to 512 rows; 40 runs it
BUDGET_ENGINE_NO_OVERLAP="${BUDGET_ENGINE_NO_OVERLAP:-35}"   # the same with --overlap off: what overlapping jobs gives
BUDGET_SERVER_NO_OVERLAP="${BUDGET_SERVER_NO_OVERLAP:-0}"   # the server's defaults with --overlap off, at NO_OVERLAP_LEVELS
NO_OVERLAP_LEVELS="${NO_OVERLAP_LEVELS:-2000}"                #   and flat out
BUDGET_SERVER_ENGINES="${BUDGET_SERVER_ENGINES:-0}"   # the server's defaults with --engines ENGINES, at ENGINES_LEVELS and flat out
ENGINES="${ENGINES:-1}"   # the A/B against the defaults, whose engines auto is 2 on a GPU with 8+ CPUs since 9101a18's check
ENGINES_LEVELS="${ENGINES_LEVELS:-2000}"   # one level: the flat-out row (after the ramp) must fit the budget; none: flat out only
if [ "$ENGINES_LEVELS" = none ]; then ENGINES_PHASES=(--skip ramp,soak); else ENGINES_PHASES=(--levels "$ENGINES_LEVELS" --level-seconds 8 --skip soak); fi
# the same server with the engine processes' kernels run at once under NVIDIA's MPS (a control daemon of the check's
# own, started for that part alone, stopped after it, which serve uses as it finds it; since 32e1f8d's check serve
# starts one itself where engine processes share a GPU: BUDGET_SERVER_NO_MPS is now the A/B); 100 runs it
BUDGET_SERVER_ENGINES_MPS="${BUDGET_SERVER_ENGINES_MPS:-0}"
# the server's defaults with --mps off: the A/B of serve's own MPS daemon (mps auto, since 32e1f8d's check) at
# NO_MPS_LEVELS and flat out; 70 runs one level
BUDGET_SERVER_NO_MPS="${BUDGET_SERVER_NO_MPS:-0}"
NO_MPS_LEVELS="${NO_MPS_LEVELS:-1000}"
MPS_ENGINES="${MPS_ENGINES:-2}"   # (9101a18 on the H200: 2 engines wrote as many words with MPS as without, 4 more)
BUDGET_TWO_ENGINES="${BUDGET_TWO_ENGINES:-0}"   # two_engines.sh: two engines alone at once, half the streams each; 45 runs it
BUDGET_TWO="${BUDGET_TWO:-0}"   # two_servers.sh: two servers on the one GPU, half the speakers each; 90 runs it
BUDGET_SERVER_DECODER="${BUDGET_SERVER_DECODER:-0}"   # --step graphs (the default before 3be976b) at DECODER_LEVELS and flat out
DECODER_LEVELS="${DECODER_LEVELS:-1000,1500}"
PROFILE_SPEAKERS="${PROFILE_SPEAKERS:-flat}"   # the engine profile flat out (the throughput target is the one still far)
BUDGET_SERVER_ONE="${BUDGET_SERVER_ONE:-0}"   # one process: measured at a5b9004 (docs/benchmarks.md); 100 runs it
ONE_LEVELS="${ONE_LEVELS:-250,500,1000}"
THROUGHPUT_STREAMS="${THROUGHPUT_STREAMS:-1024}"
# admission by headroom on the GPU: a short ramp, then levels far past it (refused speakers retry)
BUDGET_ADMISSION="${BUDGET_ADMISSION:-0}"   # measured at 74315ca (docs/server.md); 120 runs it again
ADMISSION_LEVELS="${ADMISSION_LEVELS:-1000}"
OVERLOAD_LEVELS="${OVERLOAD_LEVELS:-5000,10000}"

if [ "$PLAN" = 1 ]; then   # the parts and their budgets, nothing run, nothing installed
  planned=0
  step() { [ "$2" = 0 ] && echo "skipped  $1" || { echo "$(printf '%4d' "$2") s   $1"; planned=$((planned + $2)); }; }
  dmon_on() { :; }; dmon_off() { :; }; front_end_count() { echo auto; }; engine_count() { echo auto; }
  . <(sed -n '/^# ---- the parts/,/^# ---- end of the parts/p' "$0")
  echo "total: $planned s of budgets (besides installing the carried wheels and unpacking the test sets)"
  exit 0
fi
# what workers and engines auto choose here (server/settings.py front_end_processes, engine_processes)
auto_count() { "$PY" -c 'import server.settings as s; print(getattr(s, "'"$1"'")(s.load_settings(device="'"$DEVICE"'")))' 2>&1 | tail -1; }
front_end_count() { auto_count front_end_processes; }; engine_count() { auto_count engine_processes; }
. recipes/gpu/env.sh   # the wheels the image lacks, PYTHONPATH, a `simulserve` on PATH
if [ ! -f "$DATA/test.de" ] && [ -f .gpu/data.tar.xz ]; then   # the test sets as pack.sh check packs them
  mkdir -p "$DATA" && tar -xJf .gpu/data.tar.xz -C "$DATA"
fi

: > "$REPORT"
say() { printf '%s\n' "$@" >> "$REPORT"; }
# step TITLE BUDGET CMD...: the command's output in a code block, its exit and wall time after it
step() {
  local title="$1" budget="$2"; shift 2
  local start=$SECONDS rc
  if [ "$budget" = 0 ]; then   # a time-boxed run's choice: what it leaves out is said, not silently missing
    say "" "## $title" "" "skipped: budget 0 (\`BUDGET_*=0\`)"; echo "== $title: skipped (budget 0)"; return
  fi
  say "" "## $title" "" '```' "\$ $(printf '%q ' "$@" | sed 's|/tmp/simulserve-bin/||')"
  echo "== $title (budget ${budget}s)"
  timeout --kill-after=10 "$budget" "$@" 2>&1 | tee -a "$REPORT" | tail -n 40
  rc=${PIPESTATUS[0]}
  say '```'
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    say "**stopped at its budget of ${budget} s** (rc $rc): the figures above are what it printed by then"
  else
    say "exit $rc after $((SECONDS - start)) s"
  fi
}

# the commit measured: COMMIT=... as given where the tree was sent from (the GPU machine's own git metadata can be
# older than the tree it was sent: there, a tree of 006f0e6 reported d0771c7, the day's first copy)
if [ -z "${COMMIT:-}" ]; then
  COMMIT="$(git rev-parse --short HEAD 2>/dev/null || echo '?') (the GPU machine's git metadata; COMMIT= not given)"
fi
say "# simulserve GPU check" "" "$(date -u '+%Y-%m-%d %H:%M UTC'), commit $COMMIT"
say "" '```' "$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1)"
say "$("$PY" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")' 2>&1)"
say '```'
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
  || [ "$DEVICE" = cpu ] || { say "no CUDA device: nothing to check"; echo "no CUDA device"; exit 1; }

# SM utilisation sampled once a second through each server run (nvidia-smi dmon), summarised after it
# (dmon_on NAME BUDGET: none for a part left out, whose summary would read a file the sampler had no time to open)
dmon_on() { if [ "${2:-1}" != 0 ] && command -v nvidia-smi >/dev/null; then nvidia-smi dmon -s u -d 1 > "$DIR/dmon_$1.txt" 2>&1 & dmon=$!; fi; }
dmon_off() {
  [ -n "${dmon:-}" ] || return 0
  kill "$dmon" 2>/dev/null; dmon=
  say "" "SM utilisation during this server run (nvidia-smi dmon, % per second): $(awk '$1 ~ /^[0-9]+$/ {n++; s+=$2; if ($2>m) m=$2} END {if (n) printf "mean %.1f, max %d over %d samples", s/n, m, n; else print "no samples"}' "$DIR/dmon_$1.txt")"
}
# ---- the parts (PLAN=1 reads them from here to the end marker)
step "CUDA tests: graph replay = eager = CPU per policy (tests/test_cuda_graphs.py), device-resident state" "$BUDGET_TESTS" \
  "$PY" -m pytest -v -p no:cacheprovider -p no:flake8 -rs -k "${TESTS_K:-cuda}" $TEST_FILES
step "bench step, float32, small batches, forms $STEP_PATHS (sync-free: eager; graphs: the decoder captured at start-up; graphs-encoder: both)" "$((BUDGET_STEP / 2))" \
  simulserve bench step --device $DEVICE --checkpoint "$CKPT" --source "$DATA/test.de" \
  --batch-sizes "$SMALL_BATCHES" --sentences "$SMALL_SENTENCES" --rounds "$SMALL_ROUNDS" --paths "$STEP_PATHS" --json "$DIR/step_cuda_small.json"
step "bench step, float32, large batches, $STEP_ARRIVALS arrivals, forms $STEP_PATHS" "$((BUDGET_STEP / 2))" \
  simulserve bench step --device $DEVICE --checkpoint "$CKPT" --source "$DATA/test.de" --arrivals "$STEP_ARRIVALS" \
  --batch-sizes "$STEP_BATCHES" --sentences "$STEP_SENTENCES" --rounds "$STEP_ROUNDS" --paths "$STEP_PATHS" --json "$DIR/step_cuda.json"
OVERLAP_PATHS="${OVERLAP_PATHS:-$STEP_PATHS}"
step "bench step, float32, small batches, overlapped steps (the server's stepping loop on a GPU), forms $OVERLAP_PATHS" "$((BUDGET_STEP_OVERLAP / 3))" \
  simulserve bench step --device $DEVICE --checkpoint "$CKPT" --source "$DATA/test.de" --arrivals overlapped --host-only \
  --batch-sizes "$SMALL_BATCHES" --sentences "$((2 * SMALL_SENTENCES))" --rounds "$SMALL_ROUNDS" --paths "$OVERLAP_PATHS" \
  --json "$DIR/step_cuda_overlapped_small.json"
step "bench step, float32, large batches, overlapped steps, forms $OVERLAP_PATHS" "$((BUDGET_STEP_OVERLAP - BUDGET_STEP_OVERLAP / 3))" \
  simulserve bench step --device $DEVICE --checkpoint "$CKPT" --source "$DATA/test.de" --arrivals overlapped --host-only \
  --batch-sizes "$STEP_BATCHES" --sentences "$((2 * STEP_SENTENCES))" --rounds "$STEP_ROUNDS" --paths "$OVERLAP_PATHS" \
  --json "$DIR/step_cuda_overlapped.json"
step "the host's floor a step, small batches: graphs-encoder with the graphs' bodies recorded, none launched (recipes/host_python.py)" "$((BUDGET_HOST_FLOOR / 3))" \
  "$PY" recipes/host_python.py --device $DEVICE -m "$CKPT" --source "$DATA/test.de" --bodies recorded \
  --batch-sizes "$SMALL_BATCHES" --sentences "$SMALL_SENTENCES" --rounds 3 --json "$DIR/host_floor_small.json"
step "the host's floor a step, large batches, $STEP_ARRIVALS arrivals (recipes/host_python.py)" "$((BUDGET_HOST_FLOOR - BUDGET_HOST_FLOOR / 3))" \
  "$PY" recipes/host_python.py --device $DEVICE -m "$CKPT" --source "$DATA/test.de" --bodies recorded \
  --arrivals "$STEP_ARRIVALS" --batch-sizes "$STEP_BATCHES" --sentences "$STEP_SENTENCES" --rounds 2 \
  --json "$DIR/host_floor.json"
step "CUDA tests of graphs-fused: graph replay = eager = CPU per policy (tests/test_cuda_graphs.py)" "$BUDGET_FUSED_TESTS" \
  "$PY" -m pytest -v -p no:cacheprovider -p no:flake8 -rs -k "$FUSED_K" tests/test_cuda_graphs.py
step "bench step, float32, small batches, graphs-encoder against graphs-fused" "$BUDGET_STEP_FUSED" \
  simulserve bench step --device $DEVICE --checkpoint "$CKPT" --source "$DATA/test.de" \
  --batch-sizes "$SMALL_BATCHES" --sentences "$SMALL_SENTENCES" --rounds "$SMALL_ROUNDS" --paths graphs-encoder,graphs-fused \
  --json "$DIR/step_cuda_fused.json"
step "where a step's device time goes between its kernels, small batches (recipes/gpu/step_trace.py; traces beside the report)" "$BUDGET_STEP_TRACE" \
  "$PY" recipes/gpu/step_trace.py --device $DEVICE -m "$CKPT" --source "$DATA/test.de" --batch-sizes "$SMALL_BATCHES" \
  --sentences "$SMALL_SENTENCES" --out "$DIR"
step "bench step, bfloat16" "$BUDGET_STEP_BF16" \
  simulserve bench step --device $DEVICE --dtype bfloat16 --checkpoint "$CKPT" --source "$DATA/test.de" \
  --batch-sizes "$BF16_BATCHES" --sentences "$BF16_SENTENCES" --rounds "$STEP_ROUNDS" --paths default,compiled --json "$DIR/step_cuda_bf16.json"
step "bench engine" "$BUDGET_ENGINE" \
  simulserve bench engine --device $DEVICE -m "$CKPT" --source "$DATA/test.de" --count 3
step "graph breaks of the compiled step on $DEVICE (one graph each on the CPU: docs/benchmarks.md)" "$BUDGET_GRAPHS" \
  "$PY" recipes/graph_breaks.py --device $DEVICE
dmon_on defaults "$BUDGET_SERVER"
step "bench server, the server's defaults on CUDA (step auto = graphs-encoder, workers auto = $(front_end_count), engines auto = $(engine_count), mps auto), no admission" "$BUDGET_SERVER" \
  simulserve bench server --device $DEVICE --no-admission --checkpoint "$CKPT" --input "$DATA/test.de" \
  --levels "$SERVER_LEVELS" --level-seconds 8 --throughput-streams "$THROUGHPUT_STREAMS" --throughput-seconds 10 --skip soak \
  --client-procs "$CLIENT_PROCS" --json "$DIR/server_cuda.json"
dmon_off defaults
# the same streams flat out through the engine alone (no websockets, front ends, IPC or clients): beside the
# server's flat-out row it says whether the engine or the way to it loses the words (recipes/engine_flat_out.py),
# and --parts where a job's time goes on the engine thread (select, step, words, bookkeeping, hand-over)
step "the engine alone flat out at $THROUGHPUT_STREAMS streams, graphs-encoder (recipes/engine_flat_out.py)" "$BUDGET_ENGINE_FLAT" \
  "$PY" recipes/engine_flat_out.py --device $DEVICE --step graphs-encoder -m "$CKPT" --source "$DATA/test.de" \
  --streams "$THROUGHPUT_STREAMS" --seconds 15 --parts --chunk-stats --json "$DIR/engine_flat_out.json"
# the same with each job ending before the next is launched (--overlap off; the server's default before 95209bc):
# what launching a job's step before the job before it ends gives (server/engine.py)
step "the engine alone flat out at $THROUGHPUT_STREAMS streams, graphs-encoder, --overlap off" "$BUDGET_ENGINE_NO_OVERLAP" \
  "$PY" recipes/engine_flat_out.py --device $DEVICE --step graphs-encoder -m "$CKPT" --source "$DATA/test.de" \
  --streams "$THROUGHPUT_STREAMS" --seconds 15 --parts --overlap off --json "$DIR/engine_flat_out_no_overlap.json"
dmon_on no_overlap "$BUDGET_SERVER_NO_OVERLAP"
step "bench server, the server's defaults but --overlap off, no admission" "$BUDGET_SERVER_NO_OVERLAP" \
  simulserve bench server --device $DEVICE --overlap off --no-admission --checkpoint "$CKPT" --input "$DATA/test.de" \
  --levels "$NO_OVERLAP_LEVELS" --level-seconds 8 --throughput-streams "$THROUGHPUT_STREAMS" --throughput-seconds 10 \
  --skip soak --client-procs "$CLIENT_PROCS" --json "$DIR/server_cuda_no_overlap.json"
dmon_off no_overlap
# the server with --engines ENGINES on the one GPU: by default 1, against the defaults' two engine processes
# (docs/server.md, several engine processes); a follow-up command can try more: ENGINES=4 ENGINES_LEVELS=none
# BUDGET_SERVER_ENGINES=60 (flat out only)
dmon_on engines "$BUDGET_SERVER_ENGINES"
step "bench server, the server's defaults with --engines $ENGINES, no admission" "$BUDGET_SERVER_ENGINES" \
  simulserve bench server --device $DEVICE --engines "$ENGINES" --no-admission --checkpoint "$CKPT" --input "$DATA/test.de" \
  "${ENGINES_PHASES[@]}" --throughput-streams "$THROUGHPUT_STREAMS" --throughput-seconds 10 \
  --client-procs "$CLIENT_PROCS" --json "$DIR/server_cuda_engines$ENGINES.json"
dmon_off engines
mps_on() {   # MPS for the next part (budget $1): a control daemon with its pipes in a temporary folder
  [ "$PLAN" = 1 ] || [ "$1" = 0 ] && return 0
  if ! command -v nvidia-cuda-mps-control >/dev/null; then say "" "MPS: nvidia-cuda-mps-control is not on this machine"; return 0; fi
  local mps; mps="$(mktemp -d)"
  export CUDA_MPS_PIPE_DIRECTORY="$mps/pipe" CUDA_MPS_LOG_DIRECTORY="$mps/log"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then say "" "MPS: control daemon started"
  else say "" "MPS: the control daemon did not start (the part below ran without it)"; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; fi
}
mps_off() {
  [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] || return 0
  echo quit | nvidia-cuda-mps-control; sleep 1
  say "" "MPS: control daemon stopped; its log: $(tail -n 3 "$CUDA_MPS_LOG_DIRECTORY/control.log" 2>/dev/null | tr '\n' ' ')"
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}
dmon_on no_mps "$BUDGET_SERVER_NO_MPS"
step "bench server, the server's defaults but --mps off (the engine processes' contexts take turns), no admission" "$BUDGET_SERVER_NO_MPS" \
  simulserve bench server --device $DEVICE --mps off --no-admission --checkpoint "$CKPT" --input "$DATA/test.de" \
  --levels "$NO_MPS_LEVELS" --level-seconds 8 --skip soak --throughput-streams "$THROUGHPUT_STREAMS" --throughput-seconds 10 \
  --client-procs "$CLIENT_PROCS" --json "$DIR/server_cuda_no_mps.json"
dmon_off no_mps
mps_on "$BUDGET_SERVER_ENGINES_MPS"; dmon_on engines_mps "$BUDGET_SERVER_ENGINES_MPS"
step "bench server, the server's defaults with --engines $MPS_ENGINES under MPS, no admission" "$BUDGET_SERVER_ENGINES_MPS" \
  simulserve bench server --device $DEVICE --engines "$MPS_ENGINES" --no-admission --checkpoint "$CKPT" --input "$DATA/test.de" \
  "${ENGINES_PHASES[@]}" --throughput-streams "$THROUGHPUT_STREAMS" --throughput-seconds 10 \
  --client-procs "$CLIENT_PROCS" --json "$DIR/server_cuda_engines${MPS_ENGINES}_mps.json"
dmon_off engines_mps; mps_off
# two engines alone (no server), flat out at once with half the streams each (recipes/gpu/two_engines.sh)
step "two engines alone flat out at once on the one GPU, $((THROUGHPUT_STREAMS / 2)) streams each (recipes/gpu/two_engines.sh)" "$BUDGET_TWO_ENGINES" \
  env DEVICE="$DEVICE" PY="$PY" DATA="$DATA" CKPT="$CKPT" STREAMS="$THROUGHPUT_STREAMS" bash recipes/gpu/two_engines.sh "$DIR"
# the same with a 0.5 ms switch interval (Python's is 5 ms): whether the engine thread's waits for the interpreter
# after each CUDA synchronisation (--parts: "not running") are what stretches the flat-out step
step "the engine alone flat out at $THROUGHPUT_STREAMS streams, graphs-encoder, switch interval 0.5 ms" "$BUDGET_ENGINE_SWITCH" \
  "$PY" recipes/engine_flat_out.py --device $DEVICE --step graphs-encoder -m "$CKPT" --source "$DATA/test.de" \
  --streams "$THROUGHPUT_STREAMS" --seconds 15 --parts --switch-interval-ms 0.5 --json "$DIR/engine_flat_out_switch.json"
# and without the engine's hand-over of the interpreter after each job: whether the event loop's share then runs
# while the GPU computes (on the CPU it moved the wait into the step and changed nothing else: docs/benchmarks.md)
step "the engine alone flat out at $THROUGHPUT_STREAMS streams, graphs-encoder, no hand-over after each job" "$BUDGET_ENGINE_NO_YIELD" \
  "$PY" recipes/engine_flat_out.py --device $DEVICE --step graphs-encoder -m "$CKPT" --source "$DATA/test.de" \
  --streams "$THROUGHPUT_STREAMS" --seconds 15 --parts --no-yield --json "$DIR/engine_flat_out_no_yield.json"
# and with jobs of up to 512 rows (graphs captured up to that batch): whether the kernels' and the lock's cost per
# job spreads over twice the rows (about 2.6 and 1.5 ms of an 11 ms job of 256 on the H200 at d0771c7-006f0e6)
step "the engine alone flat out at $THROUGHPUT_STREAMS streams, graphs-encoder, jobs of up to 512 rows" "$BUDGET_ENGINE_BATCH512" \
  "$PY" recipes/engine_flat_out.py --device $DEVICE --step graphs-encoder -m "$CKPT" --source "$DATA/test.de" \
  --streams "$THROUGHPUT_STREAMS" --seconds 15 --parts --max-batch 512 --json "$DIR/engine_flat_out_batch512.json"
dmon_on decoder "$BUDGET_SERVER_DECODER"
step "bench server, --step graphs (the decoder's step alone captured), otherwise the defaults, no admission" "$BUDGET_SERVER_DECODER" \
  simulserve bench server --device $DEVICE --step graphs --no-admission --checkpoint "$CKPT" --input "$DATA/test.de" \
  --levels "$DECODER_LEVELS" --level-seconds 8 --throughput-streams "$THROUGHPUT_STREAMS" --throughput-seconds 10 --skip soak \
  --client-procs "$CLIENT_PROCS" --json "$DIR/server_cuda_decoder.json"
dmon_off decoder
step "profile of the process that steps the models, $([ "$PROFILE_SPEAKERS" = flat ] && echo "flat out at $THROUGHPUT_STREAMS streams" || echo "at $PROFILE_SPEAKERS speakers") (py-spy; recipes/gpu/profile_engine.sh)" "$BUDGET_PROFILE" \
  env DEVICE="$DEVICE" PY="$PY" DATA="$DATA" CKPT="$CKPT" CLIENT_PROCS="$CLIENT_PROCS" PROFILE_SPEAKERS="$PROFILE_SPEAKERS" \
  THROUGHPUT_STREAMS="$THROUGHPUT_STREAMS" bash recipes/gpu/profile_engine.sh "$DIR"
dmon_on one "$BUDGET_SERVER_ONE"
step "bench server, graphs form in one process (--workers 1), no admission" "$BUDGET_SERVER_ONE" \
  simulserve bench server --device $DEVICE --step graphs --workers 1 --no-admission --checkpoint "$CKPT" --input "$DATA/test.de" \
  --levels "$ONE_LEVELS" --level-seconds 8 --throughput-streams "$THROUGHPUT_STREAMS" --throughput-seconds 10 --skip soak \
  --client-procs "$CLIENT_PROCS" --json "$DIR/server_cuda_one.json"
dmon_off one
dmon_on two "$BUDGET_TWO"
step "two servers on the one GPU, half the speakers each (recipes/gpu/two_servers.sh; levels per server: ${TWO_LEVELS:-500,1000})" "$BUDGET_TWO" \
  env DEVICE="$DEVICE" DATA="$DATA" CKPT="$CKPT" CLIENT_PROCS="$CLIENT_PROCS" bash recipes/gpu/two_servers.sh "$DIR"
dmon_off two
dmon_on admission "$BUDGET_ADMISSION"
step "bench server: admission by headroom past capacity (the defaults)" "$BUDGET_ADMISSION" \
  simulserve bench server --device $DEVICE --checkpoint "$CKPT" --input "$DATA/test.de" \
  --levels "$ADMISSION_LEVELS" --overload "$OVERLOAD_LEVELS" --level-seconds 8 --skip throughput,soak \
  --client-procs "$CLIENT_PROCS" --json "$DIR/server_cuda_admission.json"
dmon_off admission
step "evaluate: float32 against bfloat16 (first $EVAL_LIMIT sentences of each set)" "$BUDGET_EVAL" \
  bash -c "for dtype in float32 bfloat16; do
      simulserve evaluate -m $CKPT --label \"GMA \$dtype\" --delta 1 --data '$DATA' \
        --sets everyday,unseen,dialogue,bible,ddtp,libreoffice --limit $EVAL_LIMIT --batch-size 64 --device $DEVICE \
        --dtype \$dtype -o /tmp/simulserve-eval-\$dtype --quiet || exit \$?
    done
    $(command -v "$PY") - <<'PYEOF'
import csv
rows = {d: {r['set']: r for r in csv.DictReader(open(f'/tmp/simulserve-eval-{d}/results.csv'))}
        for d in ('float32', 'bfloat16')}
print('| set | float32 BLEU / AL | bfloat16 BLEU / AL | ΔBLEU | ΔAL |')
print('|---|---:|---:|---:|---:|')
for name, a in sorted(rows['float32'].items()):
    b = rows['bfloat16'][name]
    print(f\"| {name} | {float(a['BLEU']):.2f} / {float(a['AL']):.2f} | {float(b['BLEU']):.2f} / {float(b['AL']):.2f} \"
          f\"| {float(b['BLEU']) - float(a['BLEU']):+.2f} | {float(b['AL']) - float(a['AL']):+.2f} |\")
PYEOF"
# ---- end of the parts
echo "report: $REPORT ($SECONDS s)"
say "" "total: $SECONDS s"
# everything written beside the report (the JSON of each benchmark, the SM samples) in one archive beside it, where
# the report lies in $OUT: a device machine returns at most 8 files, and a full check writes more (BUNDLE=0: leave
# them as they are; BUNDLE=1: bundle them wherever the report is)
if [ "${BUNDLE:-$([ -n "${OUT:-}" ] && [ "$(cd "$DIR" && pwd -P)" = "$(cd "$OUT" 2>/dev/null && pwd -P)" ] && echo 1 || echo 0)}" = 1 ]; then
  bundle="$(basename "$REPORT" .md)_files.tar.xz"
  # (not another check's report or archive: two checks in one command may share $OUT)
  files=$(cd "$DIR" && find . -maxdepth 1 -type f ! -name '*.md' ! -name '*_files.tar.xz' -printf '%P\n')
  if [ -n "$files" ]; then
    (cd "$DIR" && tar -cJf "$bundle" $files && rm -f $files) && echo "the other files: $DIR/$bundle"
  fi
fi
