#!/usr/bin/env bash
# The e2e suite N times in a row with every core busy (stress-ng), to show it does not depend on
# timing or test order. Each run spreads the suite over pytest-xdist workers as `make test` does
# (TEST_WORKERS, default 2; 0 runs it in one process). Prints one line per run (result and
# duration) and exits non-zero if any run failed.
#
#   tests/e2e/under-load.sh [RUNS=3] [extra pytest args...]
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
RUNS="${1:-3}"
shift || true
if ! command -v stress-ng >/dev/null; then
  echo "==> installing stress-ng (apt)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq stress-ng >/dev/null || {
    echo "error: stress-ng is not installed and apt-get could not install it" >&2; exit 2; }
fi

WORKERS="${TEST_WORKERS:-2}"
CORES="$(nproc)"
stress-ng --cpu "$CORES" --cpu-method matrixprod --quiet &
LOAD=$!
trap 'pkill -P "$LOAD" 2>/dev/null; kill "$LOAD" 2>/dev/null; wait "$LOAD" 2>/dev/null' EXIT
echo "==> $CORES cores loaded by stress-ng (pid $LOAD); running the e2e suite $RUNS times on $WORKERS workers" >&2

failed=0
summary=()
for run in $(seq 1 "$RUNS"); do
  start=$SECONDS
  .venv/bin/python -m pytest -m e2e -p no:cacheprovider -q -n "$WORKERS" --engines-together "$@" \
    >"/tmp/dflash-e2e-run-$run.log" 2>&1
  rc=$?
  line="$(tail -n 1 "/tmp/dflash-e2e-run-$run.log")"
  summary+=("run $run: exit $rc in $((SECONDS - start)) s: $line")
  echo "==> ${summary[-1]} (log /tmp/dflash-e2e-run-$run.log)" >&2
  [[ $rc -eq 0 ]] || failed=1
done
printf '%s\n' "${summary[@]}"
exit "$failed"
