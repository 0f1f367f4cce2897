# syntax=docker/dockerfile:1
# vLLM's router (the `vllm-router` package from PyPI, pinned) for the chart's router.enabled:
# non-root, nothing else in it.
#
#   docker build -f docker/router.Dockerfile -t ghcr.io/dflash-serve/vllm-router:0.1.17 .
#
# The version is pinned once more in pyproject.toml (the `router` extra, for the local stack and
# the benchmarks) and in the chart's router.image.tag; tests/docker check that the three agree.
FROM docker.io/library/python:3.11.11-slim-bookworm AS build
ARG VLLM_ROUTER_VERSION=0.1.17
RUN python -m venv --without-pip /opt/router \
    && python -m pip --python /opt/router/bin/python install --no-cache-dir --no-compile \
        "vllm-router==${VLLM_ROUTER_VERSION}"

FROM docker.io/library/python:3.11.11-slim-bookworm
ARG VLLM_ROUTER_VERSION=0.1.17
ARG SOURCE_URL=https://github.com/dflash-serve/dflash-serve
LABEL org.opencontainers.image.title="dflash-serve-vllm-router" \
      org.opencontainers.image.description="vLLM's router (vllm-router from PyPI) for dflash-serve" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.version="${VLLM_ROUTER_VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/router /opt/router
RUN useradd --uid 1000 --user-group --no-create-home --shell /usr/sbin/nologin router
USER 1000:1000
ENV PATH=/opt/router/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
EXPOSE 8000 29000
ENTRYPOINT ["vllm-router"]
# The commit the image was built from: the last layer, so a new commit rebuilds nothing else.
ARG REVISION=unknown
LABEL org.opencontainers.image.revision="${REVISION}"
