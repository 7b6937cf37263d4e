#!/usr/bin/env bash
# Pack what a bare GPU machine lacks into .gpu/ (ignored by git), to travel beside the tree:
#
#   bash recipes/gpu/pack.sh check   # .gpu/whl: the project's wheels the GPU image lacks (Python 3.12,
#                                    #   x86-64); .gpu/data.tar.xz: the test sets (bench and evaluate read
#                                    #   them; check.sh unpacks them to .gpu/data)
#   bash recipes/gpu/pack.sh train   # .gpu/train.tar.xz: the training data of the everyday recipes
#
# Run it here, where pip reaches the package index; the GPU machine has no network. Needs
# `simulserve prepare-data --out data/de-en-everyday --vocab-from models/checkpoints/gma_delta1` first.
# The tree (<= 50 MiB, tests/test_tree_size.py) plus .gpu must stay under the 64 MiB that travel.
set -euo pipefail
cd "$(dirname "$0")/../.."
WHAT="${1:?usage: pack.sh check|train}"
DATA="${DATA:-data/de-en-everyday}"
PY="${PY:-.venv/bin/python}"
[ -f "$DATA/spm.model" ] || { echo "no $DATA: run simulserve prepare-data first (see the header)"; exit 2; }

# What the GPU image (PyTorch, numpy, sentencepiece, safetensors, sacrebleu, pyyaml, tqdm, matplotlib,
# prometheus-client, anyio, h11, click, httpx, pytest ship there) does not have; pinned to the versions
# installed here so the GPU runs what CI tests.
WHEELS=(pydantic pydantic_core pydantic-settings annotated-types typing-inspection python-dotenv
        fastapi starlette annotated-doc uvicorn websockets anyio typing_extensions
        opentelemetry-api    # fastapi >= 0.16x imports it (the first GPU check's server step died without it)
        httptools)           # uvicorn's HTTP protocol, which server/guard.py subclasses (the second one's did)
# tools the check runs (never imported by the project), at the versions measured with
TOOLS=(py-spy==0.4.3)        # the sampling profiler of recipes/gpu/profile_engine.sh

case "$WHAT" in
check)
  rm -rf .gpu/whl .gpu/data .gpu/data.tar.xz; mkdir -p .gpu/whl
  specs=()
  for name in "${WHEELS[@]}"; do
    version=$("$PY" -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')
    [ -n "$version" ] || { echo "$name is not installed here: make setup first"; exit 2; }
    specs+=("$name==$version")
  done
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d .gpu/whl "${specs[@]}" "${TOOLS[@]}"
  # compressed (0.4 of 1.9 MB): the tree, the wheels and the training data leave little of the 64 MiB
  (cd "$DATA" && tar -cf - spm.model test.*.de test.*.en test.de test.en | xz -9 -T1) > .gpu/data.tar.xz
  ;;
train)
  mkdir -p .gpu
  # train.de/en, valid, the vocabulary and the per-source files the recipes oversample (every source but
  # the Bible, which none oversamples: round 8 on oversamples ddtp and libreoffice too)
  # xz -9e (a 64 MiB window) finds the per-source files again inside train.de/en: 9.8 MB instead of
  # 14.4 MB at xz's default, which is what lets the tree, the wheels, the test sets and the training data
  # travel together under 64 MiB (about a minute of one core here)
  (cd "$DATA" && tar -cf - spm.model manifest.json train.de train.en valid.* \
     $(ls train.*.de train.*.en | grep -v -E '^train\.bible\.') | xz -9e -T1) > .gpu/train.tar.xz
  ;;
*) echo "usage: pack.sh check|train"; exit 2 ;;
esac
du -sh .gpu/* | sed 's/^/packed /'
tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
packed=$(du -cb .gpu | tail -1 | cut -f1)
echo "tree $((tracked / 1048576)) MiB + .gpu $((packed / 1048576)) MiB (64 MiB travel; carry only the part a command needs)"
