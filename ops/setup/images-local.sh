#!/usr/bin/env bash
# Build the images with podman on a machine without registry access (no Docker engine needed).
#
#   ops/setup/images-local.sh [bases|sidecar|router|engine|cpu|all]    (make images-local: all but cpu)
#
# Stand-in bases replace what a registry would serve: docker.io/library/python:3.11.11-slim-bookworm
# is a debootstrapped Debian bookworm with python3 and pip (bookworm's Python is 3.11, as in the
# official image), and localhost/dflash-serve/vllm-openai-standin:v0.33.0 stands in for
# docker.io/vllm/vllm-openai:v0.33.0 (docker/standin/vllm-openai.Dockerfile). Bases are built
# once and reused; image builds reuse podman's layer cache. Podman runs with runc and no rlimits
# (a private CONTAINERS_CONF), and builds see the host's CA bundle and pip configuration (this
# machine's egress re-signs TLS) and its wheel folder (torch's CPU wheel).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
CACHE="$ROOT/.cache/podman"
mkdir -p "$CACHE"
export CONTAINERS_CONF="$CACHE/containers.conf"
cat >"$CONTAINERS_CONF" <<'CONF'
[containers]
default_ulimits = []

[engine]
runtime = "runc"
CONF
cat >"$CACHE/pip.conf" <<CONF
[global]
cert = /etc/ssl/certs/ca-certificates.crt
disable-pip-version-check = true
$( [[ -d /opt/wheels ]] && echo "find-links = /opt/wheels" )
CONF

TAG="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)"
PYTHON_BASE="docker.io/library/python:3.11.11-slim-bookworm"
VLLM_STANDIN="localhost/dflash-serve/vllm-openai-standin:v0.33.0"
SIDECAR_IMAGE="localhost/dflash-serve/sidecar:$TAG"
ENGINE_IMAGE="localhost/dflash-serve/vllm-dflash:0.33.0-dflash-$TAG"
CPU_IMAGE="localhost/dflash-serve/dflash-serve-cpu:$TAG"
ROUTER_VERSION="$(sed -n 's/^ARG VLLM_ROUTER_VERSION=//p' docker/router.Dockerfile | head -n1)"
ROUTER_IMAGE="localhost/dflash-serve/vllm-router:$ROUTER_VERSION"
# The commit, for the images' org.opencontainers.image.revision label (their last layer).
REVISION="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
BUILD=(podman build --format docker --network=host --pull=never --build-arg "REVISION=$REVISION"
       -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro
       -v "$CACHE/pip.conf:/etc/pip.conf:ro")
[[ -d /opt/wheels ]] && BUILD+=(-v /opt/wheels:/opt/wheels:ro)

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
timed() { local label="$1" start=$SECONDS; shift; "$@"; log "$label done in $((SECONDS - start)) s"; }

# What the stand-in python base holds (bookworm's Python is 3.11, as in the official image; the
# official image also ships Python's headers, which the CPU engine's torch compile needs).
PYTHON_BASE_PACKAGES="python3,python3-pip,python3-venv,python3.11-dev,ca-certificates"

python_base() {
  local recipe
  recipe="$(podman image inspect --format '{{index .Labels "io.dflash-serve.standin"}}' "$PYTHON_BASE" 2>/dev/null || true)"
  if [[ "$recipe" == "$PYTHON_BASE_PACKAGES" ]]; then log "$PYTHON_BASE is present"; return; fi
  log "stand-in $PYTHON_BASE: debootstrap bookworm with $PYTHON_BASE_PACKAGES (about a minute)"
  local rootfs="$CACHE/rootfs-python"
  rm -rf "$rootfs"
  local mirror
  mirror="$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)"
  debootstrap --variant=minbase --include="$PYTHON_BASE_PACKAGES" \
    bookworm "$rootfs" "${mirror:-http://deb.debian.org/debian}" >"$CACHE/debootstrap.log"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
  rm -f "$rootfs"/usr/lib/python3.*/EXTERNALLY-MANAGED
  ln -sf /usr/bin/python3 "$rootfs/usr/local/bin/python"
  ln -sf /usr/bin/pip3 "$rootfs/usr/local/bin/pip"
  tar -C "$rootfs" -c . | podman import --change 'CMD ["python3"]' \
    --change "LABEL io.dflash-serve.standin=$PYTHON_BASE_PACKAGES" - "$PYTHON_BASE" >/dev/null
  rm -rf "$rootfs"
}

vllm_standin() {
  # Rebuilt from the layer cache every time: a no-op unless its base or recipe changed.
  log "stand-in $VLLM_STANDIN: the vllm==0.33.0 wheel on CPU torch (about two minutes when cold)"
  bash ops/setup/setup.sh vllm-wheel
  "${BUILD[@]}" -v "$ROOT/.cache/wheels:/wheels:ro" \
    -f docker/standin/vllm-openai.Dockerfile -t "$VLLM_STANDIN" .
}

sidecar() {
  log "sidecar image $SIDECAR_IMAGE"
  "${BUILD[@]}" --build-arg "DFLASH_VERSION=$TAG" -f docker/sidecar.Dockerfile -t "$SIDECAR_IMAGE" .
}

router() {
  log "router image $ROUTER_IMAGE (vllm-router $ROUTER_VERSION from PyPI)"
  "${BUILD[@]}" -f docker/router.Dockerfile -t "$ROUTER_IMAGE" .
}

engine() {
  log "engine image $ENGINE_IMAGE (on the stand-in vLLM base)"
  local series
  series="$(python3 -c 'import hashlib, json; m = json.load(open("patches/manifest.json")); print(hashlib.sha256("".join(p["sha256"] for p in m["patches"]).encode()).hexdigest())')"
  "${BUILD[@]}" --build-arg "VLLM_BASE_IMAGE=$VLLM_STANDIN" --build-arg "DFLASH_VERSION=$TAG" \
    --build-arg "PATCH_SERIES_SHA256=$series" -f docker/vllm.Dockerfile -t "$ENGINE_IMAGE" .
}

cpu() {
  log "CPU local-stack image $CPU_IMAGE (large: vLLM CPU build and torch)"
  "${BUILD[@]}" --build-arg "DFLASH_VERSION=$TAG" --build-arg "TORCH_INDEX=" \
    -f docker/cpu.Dockerfile -t "$CPU_IMAGE" .
}

for tool in podman runc debootstrap; do
  command -v "$tool" >/dev/null || { echo "error: $tool is missing: make setup installs it (apt-get install podman runc debootstrap)" >&2; exit 1; }
done
case "${1:-all}" in
  bases) timed "python base" python_base; timed "vLLM stand-in base" vllm_standin ;;
  sidecar) timed "python base" python_base; timed "sidecar image" sidecar ;;
  router) timed "python base" python_base; timed "router image" router ;;
  engine) timed "python base" python_base; timed "vLLM stand-in base" vllm_standin; timed "engine image" engine ;;
  cpu) timed "python base" python_base; timed "CPU image" cpu ;;
  all)
    timed "python base" python_base
    timed "vLLM stand-in base" vllm_standin
    timed "sidecar image" sidecar
    timed "router image" router
    timed "engine image" engine
    ;;
  *) echo "usage: $0 [bases|sidecar|router|engine|cpu|all]" >&2; exit 2 ;;
esac
