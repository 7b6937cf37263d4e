#!/usr/bin/env bash
# A time-boxed GPU run in one command: the GPU check (check.sh, under 5 minutes), then
# the training runs named, side by side, for the time that is left. One command pays one machine start,
# which suits a GPU machine lent for a short time (e.g. 15 minutes in all, at most 10 per command):
#
#   bash recipes/gpu/run_boxed.sh SECONDS RECIPE...    # e.g. 540 recipes/gma_delta1.yaml recipes/waitk.yaml
#
# SECONDS: the wall time the whole command may take (keep it under the command limit; TRAIN_MINUTES=M
# fixes the training time instead). Carry `.gpu`
# (`bash recipes/gpu/pack.sh check` and `pack.sh train` here first). What comes back, at most 8 files:
#   $OUT/gpu_check.md, $OUT/gpu_check_files.tar.xz (the benchmarks' JSON, logs, dmon samples and the engine's profile),
#   per run $OUT/NAME/model.safetensors (fp16) and $OUT/NAME/run.tar (config.json, logs, progress).
set -uo pipefail
cd "$(dirname "$0")/../.."
TOTAL="${1:?usage: run_boxed.sh SECONDS RECIPE...}"; shift
DEST="${OUT:-runs/gpu}"
export PY="${PY:-python3}"
TRAIN_DATA="${TRAIN_DATA:-/tmp/simulserve-data}"   # check.sh reads DATA (the test sets, .gpu/data)
mkdir -p "$DEST" "$TRAIN_DATA"
tar -xJf "${TRAIN_TAR:-.gpu/train.tar.xz}" -C "$TRAIN_DATA" & untar=$!   # unpacked while the check runs, once for all runs
. recipes/gpu/env.sh                                # installed once: the runs below must not race on it

# check.sh in its quick form (QUICK=1: the graph-replay tests, bench step of the default form, bench server with
# the server's defaults, within 239 s of budgets; QUICK=0 runs its full set); parts at budget 0 unless set.
# (everything else it writes beside the report in one file, gpu_check_files.tar.xz: the device returns at most 8)
QUICK="${QUICK:-1}" BUNDLE=1 bash recipes/gpu/check.sh "$DEST/gpu_check.md"
wait "$untar" || { echo "could not unpack ${TRAIN_TAR:-.gpu/train.tar.xz}"; exit 2; }

# what is left, less ~40 s of loading before training starts and ~35 s of export and packing after it
minutes="${TRAIN_MINUTES:-$("$PY" -c "print(f'{max(0.5, ($TOTAL - $SECONDS - 75) / 60):.2f}')")}"
echo "== training $# run(s) side by side for $minutes minutes"
pids=()
for recipe in "$@"; do
  name="$(basename "$recipe" .yaml)"
  mkdir -p "$DEST/$name"
  OUT="$DEST" DATA="$TRAIN_DATA" bash recipes/gpu/train.sh "$recipe" "$minutes" > "$DEST/$name/train.log" 2>&1 & pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
for recipe in "$@"; do
  name="$(basename "$recipe" .yaml)"
  tail -n 5 "$DEST/$name/train.log"
  # spm.model is the shipped one; everything small goes into one file, to stay under 8 files back
  (cd "$DEST/$name" && rm -f spm.model && tar -cf run.tar $(ls | grep -v -e '^model.safetensors$' -e '^run.tar$') \
     && find . -maxdepth 1 -type f ! -name model.safetensors ! -name run.tar -delete)
done
ls -la "$DEST" "$DEST"/*/
echo "run_boxed.sh: $SECONDS s, training rc $rc"
exit "$rc"
