#!/usr/bin/env bash
# The patched image's build step (docker/vllm.Dockerfile runs it; tests run it on the real wheel).
#   docker/patch-vllm.sh [--check-base | --install-project DIR] [SITE_PACKAGES]
# Fails the build loudly unless vLLM is exactly 0.33.0, the series applies, every patched file
# hashes as the manifest says and byte-compiles, and the self check finds the patch in place.
# --install-project puts DIR's ops/, service/ and patches/ packages on the interpreter's path
# (a .pth file and a `dflash-serve` launcher): no download, no build backend. --check-base
# stops after step 1 (the image's first step: a wrong base fails before anything is fetched).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SERIES_DIR="${DFLASH_SERIES_DIR:-$HERE/../patches}"
PYTHON="${PYTHON:-python3}"
PROJECT=""
CHECK_BASE=""
if [[ "${1:-}" == "--check-base" ]]; then
  CHECK_BASE=1
  shift
elif [[ "${1:-}" == "--install-project" ]]; then
  PROJECT="$2"
  SERIES_DIR="$PROJECT/patches"
  shift 2
fi

if [[ $# -ge 1 ]]; then
  SITE_PACKAGES="$1"
else
  SITE_PACKAGES="$("$PYTHON" - <<'PY'
import importlib.util, pathlib, sys
spec = importlib.util.find_spec("vllm")
if spec is None or spec.origin is None:
    sys.exit("error: this image has no vllm package; the dflash-serve patch series needs "
             "vllm==0.33.0 (build FROM docker.io/vllm/vllm-openai:v0.33.0)")
print(pathlib.Path(spec.origin).parent.parent)
PY
)"
fi

echo "==> [1/4] vLLM in $SITE_PACKAGES must be 0.33.0"
"$PYTHON" - "$SITE_PACKAGES" <<'PY'
import sys
from importlib.metadata import distributions
found = {(d.metadata["Name"] or "").lower(): d.version for d in distributions(path=[sys.argv[1]])}
if found.get("vllm") != "0.33.0":
    sys.exit(f"error: expected vllm==0.33.0 in {sys.argv[1]}, found {found.get('vllm') or found}")
PY
[[ -n "$CHECK_BASE" ]] && exit 0

if [[ -n "$PROJECT" ]]; then
  printf '%s\n' "$PROJECT/ops" "$PROJECT/service" "$PROJECT/patches" >"$SITE_PACKAGES/dflash-serve.pth"
  printf '#!/bin/sh\nexec %s -m dflash_ops.cli "$@"\n' "$(command -v "$PYTHON")" >/usr/local/bin/dflash-serve
  chmod 0755 /usr/local/bin/dflash-serve
  echo "    dflash-serve: $PROJECT on the path of $SITE_PACKAGES"
fi

echo "==> [2/4] applying the patch series ($SERIES_DIR)"
"$PYTHON" -m dflash_ops.cli patches apply --site-packages "$SITE_PACKAGES" --series-dir "$SERIES_DIR"
"$PYTHON" -m dflash_ops.cli patches check --require-applied --site-packages "$SITE_PACKAGES" --series-dir "$SERIES_DIR"

echo "==> [3/4] byte-compiling the patched files"
"$PYTHON" - "$SITE_PACKAGES" "$SERIES_DIR" <<'PY'
import json, py_compile, sys, pathlib
site, series = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
manifest = json.loads((series / "manifest.json").read_text())
targets = sorted({target for entry in manifest["patches"] for target in entry["targets"]})
for target in targets:
    py_compile.compile(str(site / target), doraise=True)
    print(f"    compiled {target}")
PY

echo "==> [4/4] self check"
PYTHONPATH="$SITE_PACKAGES${PYTHONPATH:+:$PYTHONPATH}" DFLASH_EXPECT_RAY="${DFLASH_EXPECT_RAY:-}" \
  "$PYTHON" "$HERE/selfcheck.py"
