# syntax=docker/dockerfile:1
# The load-test client, llmserve/loadtest: `python -m loadtest compare` (locust, the report's
# plots). The chart's comparison Job (compare.enabled) runs it inside the cluster.
# Build from the repository root:
#   docker build -f deploy/docker/loadtest.Dockerfile -t REGISTRY/llmserve/loadtest:0.1.0 .
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml ./
COPY gateway gateway
COPY worker worker
COPY model_store model_store
COPY loadtest loadtest
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[loadtest]"

FROM python:3.11-slim-bookworm
RUN groupadd --gid 10001 llmserve \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin llmserve
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels "llmserve[loadtest]" \
 && rm -rf /wheels
# matplotlib writes its cache under MPLCONFIGDIR; the root filesystem is read-only in the chart.
ENV PYTHONUNBUFFERED=1 HOME=/tmp MPLCONFIGDIR=/tmp/matplotlib MPLBACKEND=Agg
USER 10001:10001
# A run-once client: the Job's exit status is its health.
HEALTHCHECK NONE
ENTRYPOINT ["python3", "-m", "loadtest"]
