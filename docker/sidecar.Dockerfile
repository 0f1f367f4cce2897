# syntax=docker/dockerfile:1
# The dflash-serve sidecar (and the `helm test` checks): small, non-root, no ML libraries.
#
#   docker build -f docker/sidecar.Dockerfile -t ghcr.io/dflash-serve/sidecar:0.1.0 .
FROM docker.io/library/python:3.11.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY ops/ ops/
COPY service/ service/
COPY patches/ patches/
RUN python -m pip wheel --no-cache-dir --wheel-dir /wheels .

FROM docker.io/library/python:3.11.11-slim-bookworm
ARG DFLASH_VERSION=0.1.0
ARG SOURCE_URL=https://github.com/dflash-serve/dflash-serve
LABEL org.opencontainers.image.title="dflash-serve-sidecar" \
      org.opencontainers.image.description="Health, readiness and speculative-decoding metrics next to vLLM" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.version="${DFLASH_VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /wheels /wheels
RUN python -m pip install --no-cache-dir /wheels/*.whl \
    && rm -rf /wheels \
    && useradd --uid 1000 --user-group --no-create-home --shell /usr/sbin/nologin dflash
USER 1000:1000
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 MPLCONFIGDIR=/tmp
EXPOSE 9100
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
  CMD ["python", "-c", "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:9100/livez', timeout=2).status != 200)"]
ENTRYPOINT ["dflash-serve"]
CMD ["sidecar"]
