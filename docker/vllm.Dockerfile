# syntax=docker/dockerfile:1
# The patched vLLM 0.33.0 engine image: the official OpenAI server image plus the dflash-serve
# patch series. The build fails unless the series applies to exactly 0.33.0 and self-checks.
#
#   docker build -f docker/vllm.Dockerfile -t ghcr.io/dflash-serve/vllm-dflash:0.33.0-dflash-0.1.0 .
ARG VLLM_BASE_IMAGE=docker.io/vllm/vllm-openai:v0.33.0
FROM ${VLLM_BASE_IMAGE}

ARG DFLASH_VERSION=0.1.0
ARG PATCH_SERIES_SHA256=unknown
ARG SOURCE_URL=https://github.com/dflash-serve/dflash-serve
LABEL org.opencontainers.image.title="vllm-dflash" \
      org.opencontainers.image.description="vLLM 0.33.0 with the dflash-serve patch series (DFlash drafts on Qwen4Exp)" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.version="${DFLASH_VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.dflash-serve.vllm.version="0.33.0" \
      io.dflash-serve.patch-series.sha256="${PATCH_SERIES_SHA256}"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /opt/dflash-serve
COPY pyproject.toml README.md ./
COPY ops/ ops/
COPY service/ service/
COPY patches/ patches/
COPY docker/patch-vllm.sh docker/selfcheck.py docker/

# The project without its dependencies: the engine image already has what the CLI's patch and
# plan commands import (pydantic, httpx, jinja2, pyyaml); no weights, no extra downloads.
RUN python3 -m pip install --no-cache-dir --no-deps /opt/dflash-serve \
    && DFLASH_SERIES_DIR=/opt/dflash-serve/patches docker/patch-vllm.sh

ENV HOME=/tmp
EXPOSE 8000
# `vllm serve` (not the deprecated `python -m vllm.entrypoints.openai.api_server` shim, which
# skips the API-server count and multiprocess metrics set-up). The PLE n-gram table offload is
# `--engram-config '{"cpu_offload": true}'` (vLLM 0.33.0's default for this model).
ENTRYPOINT ["vllm", "serve"]
