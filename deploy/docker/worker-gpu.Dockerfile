# syntax=docker/dockerfile:1
# GPU workers: the official vLLM image plus this project's worker launcher, llmserve/worker-gpu.
# Build from the repository root:
#   docker build -f deploy/docker/worker-gpu.Dockerfile -t REGISTRY/llmserve/worker-gpu:0.1.0 .
# vLLM, torch and CUDA come from the official image untouched: the project is installed with the
# image's own package versions as constraints, so nothing of vLLM's is up- or downgraded.
ARG VLLM_VERSION=v0.32.0
FROM vllm/vllm-openai:${VLLM_VERSION}

COPY pyproject.toml /src/pyproject.toml
COPY gateway /src/gateway
COPY worker /src/worker
COPY model_store /src/model_store
# The image may ship pip or only uv; either installs into vLLM's own interpreter. gguf and
# accelerate let the model-fetch Job build the demo model with this image too.
RUN set -eux; \
    py="$(command -v python3)"; \
    if "$py" -m pip --version >/dev/null 2>&1; then install="$py -m pip install --no-cache-dir"; \
      freeze="$py -m pip freeze"; \
    else install="uv pip install --no-cache --python $py"; freeze="uv pip freeze --python $py"; fi; \
    $freeze | grep -v '^-e ' > /tmp/constraints.txt; \
    $install -c /tmp/constraints.txt /src gguf accelerate; \
    rm -rf /src /tmp/constraints.txt; \
    groupadd --gid 10001 llmserve; \
    useradd --uid 10001 --gid 10001 --no-create-home --home-dir /cache --shell /usr/sbin/nologin llmserve

ENV PYTHONUNBUFFERED=1
USER 10001:10001
EXPOSE 8000
# Kubernetes probes the engine's /health (startup, readiness, liveness).
HEALTHCHECK NONE
# The official image's entrypoint is `vllm serve`; the worker builds that command from WORKER_*.
ENTRYPOINT ["python3", "-m", "worker"]
