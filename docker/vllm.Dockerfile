# syntax=docker/dockerfile:1
# The patched vLLM 0.33.0 engine image: the official OpenAI server image plus the dflash-serve
# patch series. The build fails unless the series applies to exactly 0.33.0 and self-checks.
#
#   docker build -f docker/vllm.Dockerfile -t ghcr.io/dflash-serve/vllm-dflash:0.33.0-dflash-0.1.0 .
#
# Only Ray is downloaded: the project's pure-Python packages are put on the interpreter's path
# (a .pth file) instead of being pip-installed, which would fetch a build backend. The CLI's
# patch and plan commands import only what the vLLM image already has (pydantic, pyyaml).
# Build with the Docker image format (podman: --format docker).
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

WORKDIR /opt/dflash-serve
# A base without vllm==0.33.0 fails here, before anything is fetched.
COPY docker/patch-vllm.sh docker/ray-version.txt docker/
RUN docker/patch-vllm.sh --check-base
# Ray for the distributed layout on KubeRay (the vLLM 0.33.0 wheel declares none), at the one
# version the chart's RayCluster names (docker/ray-version.txt; `make generate` copies it into
# the chart). [default] brings the dashboard agent Ray's metrics and KubeRay's tooling use.
RUN python3 -m pip install --no-cache-dir "ray[default]==$(cat docker/ray-version.txt)"

COPY ops/ ops/
COPY service/ service/
COPY patches/ patches/
COPY docker/patch-vllm.sh docker/selfcheck.py docker/

RUN DFLASH_EXPECT_RAY="$(cat docker/ray-version.txt)" docker/patch-vllm.sh --install-project /opt/dflash-serve

ENV HOME=/tmp
EXPOSE 8000
# `vllm serve` (not the deprecated `python -m vllm.entrypoints.openai.api_server` shim, which
# skips the API-server count and multiprocess metrics set-up). The PLE n-gram table offload is
# `--engram-config '{"cpu_offload": true}'` (vLLM 0.33.0's default for this model).
ENTRYPOINT ["vllm", "serve"]
# Which patches of the series each model relies on (ops/dflash_ops/model_profiles.py; `dflash-serve
# patches check --model NAME` checks them): GLM-5.3-Flash runs unpatched but for 0004.
LABEL io.dflash-serve.patches.qwen3.8-flash-next="0001,0002,0003,0004" \
      io.dflash-serve.patches.glm-5.3-flash="0004"
# The commit the image was built from: the last layer, so a new commit rebuilds nothing else.
ARG REVISION=unknown
LABEL org.opencontainers.image.revision="${REVISION}"
