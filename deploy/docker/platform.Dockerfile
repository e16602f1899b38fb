# syntax=docker/dockerfile:1
# The gateway and the model puller (`model_store`): one small Python image, llmserve/platform.
# With the `epp` extra: the same image runs the gateway's EPP mode (`python3 -m gateway epp`).
# Build from the repository root:
#   docker build -f deploy/docker/platform.Dockerfile -t REGISTRY/llmserve/platform:0.1.0 .
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml ./
COPY gateway gateway
COPY worker worker
COPY model_store model_store
# Wheels for the project and every dependency, built here: the final stage installs them offline.
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[epp]"

FROM python:3.11-slim-bookworm
# The UID/GID the chart's podSecurityContext runs as (runAsNonRoot needs a numeric USER).
RUN groupadd --gid 10001 llmserve \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin llmserve
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels "llmserve[epp]" \
 && rm -rf /wheels
ENV PYTHONUNBUFFERED=1 HOME=/tmp
USER 10001:10001
EXPOSE 8000
# Kubernetes probes /health and /ready; a Docker HEALTHCHECK would only duplicate them.
HEALTHCHECK NONE
ENTRYPOINT ["python3", "-m", "gateway"]
