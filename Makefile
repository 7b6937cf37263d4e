# The README's two commands:  `make serve`  and  `make test`.
# Both set up .venv on a fresh machine first (idempotent).
# `make demo`: the caption page served from the CPU image (docker compose, else podman; docs/docker.md).
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
HOST    ?= 127.0.0.1
PORT    ?= 8000
# torch is pinned here, installed before the project: an unpinned resolution
# would pull a multi-GB CUDA build. On a GPU machine: make setup TORCH_SPEC=torch
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup setup-test serve test bench demo clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install --quiet -e ".[eval,test,peer,ray,longform]"
	# simulstream's scorers score the long-form logs in tests/test_longform.py; the package
	# requires torch (unpinned), librosa and COMET's extras for its speech server, which the
	# scorers do not use: installed without its dependencies (pyyaml and mweralign come above)
	$(BIN)/pip install --quiet --no-deps "simulstream==1.0.0"
	-bash docker/install-browser.sh
	-bash docker/install-engine.sh
	touch $@

setup: $(VENV)/.installed
setup-test: $(VENV)/.installed-test

serve: setup
	$(BIN)/simulserve serve --host $(HOST) --port $(PORT)

test: setup-test
	$(BIN)/python -m pytest -q -ra tests

demo:
	-bash docker/install-engine.sh
	bash docker/demo.sh --port $(PORT)

bench: setup
	$(BIN)/simulserve bench engine

clean:
	rm -rf $(VENV) build *.egg-info
