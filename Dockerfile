# syntax=docker/dockerfile:1.7
#
# dam-operator: one image, three roles, all through the `dam` command.
#
#   dam operator                 the Kubernetes operator and its pod webhook (default)
#   dam sidecar --port 9450      the per-pod exporter injected by the webhook
#   dam probe-install /dam/probe copies the automatic instrumentation into a shared volume
#
# Build:  docker build -t ghcr.io/mlsys/dam-operator:0.1.0 --build-arg VERSION=0.1.0 .
# The base image is pinned by version; pin it by digest too in your registry mirror
# (PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:...).
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

# --- builder: the project wheel and the wheels of its dependencies ----------
# The builder is never shipped, so it carries no labels.
# hadolint ignore=DL3049
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY sidecar/ sidecar/
COPY operator/ operator/
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# --- runtime: the wheels installed, nothing else -----------------------------
FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="dam-operator" \
      org.opencontainers.image.description="Tells an ML training job which axis holds it back (Data, Algorithm, Machine) and which lever to pull." \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/mlsys/dam-operator" \
      org.opencontainers.image.documentation="https://github.com/mlsys/dam-operator/blob/main/docs/install.md" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="dam-operator"
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp
# The wheels come in through a bind mount, so no layer keeps them; pip keeps no cache.
# Installing byte-compiles the package once here: the root file system is read-only at run time.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels "dam-operator==${VERSION}" \
    && dam --help > /dev/null
# Numeric, non-root (the "nonroot" id of distroless images); Kubernetes can verify runAsNonRoot.
USER 65532:65532
WORKDIR /tmp
# Sidecar /metrics (9450); operator webhook HTTPS (9443), kopf liveness (8080), operator /metrics (8081).
EXPOSE 9450 9443 8080 8081
# No HEALTHCHECK: Kubernetes liveness/readiness probes check each role.
ENTRYPOINT ["dam"]
CMD ["operator"]
