# Shared by run.sh and distill.sh (sourced): the arms' data and starting weights.
SIMULSERVE="${SIMULSERVE:-.venv/bin/simulserve}"
LIMIT="${LIMIT:-200}"
OUT=runs/gma_init
DATA=data/de-en-gma-init
N=(nice -n "${NICE:-0}")
mkdir -p "$OUT"
# the seven sources the arms trained on: openclonk and scummvm came later and are left out, so that every
# arm sees the same pairs (older sources' splits do not depend on them; models/data/prepare.py)
if [ ! -f "$DATA/manifest.json" ]; then
  "$SIMULSERVE" prepare-data --out "$DATA" --download-dir data/downloads \
    --sources bible,libreoffice,ddtp,auf-deutsch,freedroid,hedgewars,wesnoth \
    --vocab-from models/checkpoints/gma_delta1
fi
BASE=66f7e6b
for m in gma_delta1 waitk; do          # the starting weights, from git (the shipped models of that commit)
  mkdir -p "$OUT/base_$m"
  for f in config.json model.safetensors spm.model; do
    [ -s "$OUT/base_$m/$f" ] || git show "$BASE:models/checkpoints/$m/$f" > "$OUT/base_$m/$f"
  done
done
# train NAME RECIPE [OVERRIDE...]: recipes/gma_init/RECIPE.yaml into runs/gma_init/NAME, logged to NAME.log
train() {
  local name=$1 recipe=$2; shift 2
  "${N[@]}" "$SIMULSERVE" train "recipes/gma_init/$recipe.yaml" --output "$OUT/$name" "$@" \
    --threads 1 --no-progress > "$OUT/$name.log" 2>&1
}
