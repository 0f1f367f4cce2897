# syntax=docker/dockerfile:1
# The dflash-serve sidecar (and the `helm test` checks): small, non-root, no ML libraries.
#
#   docker build -f docker/sidecar.Dockerfile -t ghcr.io/dflash-serve/sidecar:0.1.0 .
#   docker build -f docker/sidecar.Dockerfile --build-arg EXTRAS=kubernetes ...  # Events
#
# Build with the Docker image format (podman: --format docker): the OCI format drops HEALTHCHECK.
# The build stage fetches the project's build backend and dependencies from PyPI.
FROM docker.io/library/python:3.11.11-slim-bookworm AS build
ARG DFLASH_VERSION=0.1.0
ARG EXTRAS=""
WORKDIR /src
COPY pyproject.toml README.md ./
COPY ops/ ops/
COPY service/ service/
COPY patches/ patches/
# A venv without pip, filled by the base image's pip; no bytecode (it would double the size, and
# the read-only root filesystem could not keep what Python compiles at start anyway).
RUN python -m venv --without-pip /opt/dflash \
    && python -m pip --python /opt/dflash/bin/python install --no-cache-dir --no-compile \
        ".${EXTRAS:+[$EXTRAS]}" \
    && /opt/dflash/bin/python -c "import importlib.metadata as m, sys; v = m.version('dflash-serve'); \
sys.exit(None if v == '${DFLASH_VERSION}' else f'the source is dflash-serve {v}, not DFLASH_VERSION=${DFLASH_VERSION}')"

FROM docker.io/library/python:3.11.11-slim-bookworm
ARG DFLASH_VERSION=0.1.0
ARG EXTRAS=""
ARG SOURCE_URL=https://github.com/dflash-serve/dflash-serve
LABEL org.opencontainers.image.title="dflash-serve-sidecar" \
      org.opencontainers.image.description="Health, readiness and speculative-decoding metrics next to vLLM; the helm test checks" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.version="${DFLASH_VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.dflash-serve.extras="${EXTRAS}"
COPY --from=build /opt/dflash /opt/dflash
RUN useradd --uid 1000 --user-group --no-create-home --shell /usr/sbin/nologin dflash
USER 1000:1000
ENV PATH=/opt/dflash/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
EXPOSE 9100
# Checks the port the sidecar was started with (--port or DFLASH_SIDECAR_PORT), not a fixed one.
HEALTHCHECK --interval=10s --timeout=3s --retries=3 CMD ["python", "-m", "dflash_sidecar.healthcheck"]
ENTRYPOINT ["dflash-serve"]
CMD ["sidecar"]
# The commit the image was built from: the last layer, so a new commit rebuilds nothing else.
ARG REVISION=unknown
LABEL org.opencontainers.image.revision="${REVISION}"
