#!/usr/bin/env bash
# The test suite's two pytest passes, run side by side (`make test` calls this):
#   pass 1: .venv         the project, the vLLM CPU engine, helm, prometheus, podman
#   pass 2: .venv-vllm033 the tests against the exact vllm==0.33.0 sources (marker vllm033)
# Pass 1 mostly waits on engines and servers, pass 2 mostly computes, so together they take
# about as long as pass 1 alone. Pass 2 writes to a log that is printed when pass 1 is done.
# Arguments are passed to both pytest runs. Exits non-zero if either pass failed. Each pass ends
# with its 30 slowest tests (--durations), so a change sees what it added beside the phase table.
set -uo pipefail
cd "$(dirname "$0")/../.."

log_dir=.cache/test-logs
mkdir -p "$log_dir"
pass2_log="$log_dir/pass2.log"
# Separate pytest temp roots: each pass prunes its own old runs, never the other's.
pass2_tmp="${TMPDIR:-/tmp}/dflash-serve-pytest-pass2"
mkdir -p "$pass2_tmp"

start=$SECONDS
echo "==> pytest pass 2 (.venv-vllm033: tests against the exact vllm==0.33.0 sources) started" \
    "in the background; its output: $pass2_log (printed after pass 1)"
# PASS2_NICE=N (`make test` sets 10) runs pass 2 at nice N, in a session of its own at autogroup
# nice N: Linux shares the CPU between sessions first (sched_autogroup) and pass 1's engines each
# run in a session of their own, so a plain nice would only rank pass 2 against itself. Pass 2,
# which only computes, then takes what the engines leave instead of an equal share against each
# of them while they generate. (`make check` starts no engine: both passes compute there and
# share equally.) Without autogroups the plain nice does the same.
pass2_cmd=(.venv-vllm033/bin/python -m pytest --durations=30 "$@")
if [[ -n "${PASS2_NICE:-}" ]]; then
    pass2_cmd=(setsid nice -n "$PASS2_NICE" bash -c
        'echo "$0" 2>/dev/null >/proc/self/autogroup; exec "$@"' "$PASS2_NICE" "${pass2_cmd[@]}")
fi
PYTEST_DEBUG_TEMPROOT="$pass2_tmp" "${pass2_cmd[@]}" >"$pass2_log" 2>&1 &
pass2_pid=$!
trap 'kill "$pass2_pid" 2>/dev/null; exit 130' INT TERM

# PASS1_WORKERS=N spreads pass 1 over N pytest-xdist workers (`make test` and `make check` set
# 2; `make test` adds --engines-together: a module per worker at a time, the modules sharing the
# local stack together, engine tests first). Unset or 0, pass 1 runs in one process.
workers=()
if [[ -n "${PASS1_WORKERS:-}" && "${PASS1_WORKERS}" != 0 ]]; then
    workers=(-n "$PASS1_WORKERS")
fi
echo "==> pytest pass 1 (.venv: project, vLLM CPU engine, helm, prometheus, podman)" \
    "${workers[*]:+on $PASS1_WORKERS workers}"
.venv/bin/python -m pytest --durations=30 "${workers[@]}" "$@"
pass1=$?
pass1_s=$((SECONDS - start))
echo "==> pytest pass 1 $([ $pass1 -eq 0 ] && echo passed || echo FAILED) in $((SECONDS - start)) s"

if kill -0 "$pass2_pid" 2>/dev/null; then
    echo "==> waiting for pytest pass 2"
fi
wait "$pass2_pid"
pass2=$?
# Pass 2 writes its own duration (pytest's last line); pass 1's is the wall clock.
pass2_s=$(grep -oE 'in [0-9.]+s' "$pass2_log" | tail -n1 | grep -oE '[0-9]+' | head -n1)
pass2_s=${pass2_s:-0}
echo "==> pytest pass 2 output:"
cat "$pass2_log"
echo "==> pytest pass 2 $([ $pass2 -eq 0 ] && echo passed || echo FAILED);" \
    "both passes took $((SECONDS - start)) s"

# The phase table (make appends set-up, lint, types and images to it before this script runs).
phases="$log_dir/phases.tsv"
printf 'pytest pass 1 (.venv)\t%s\n' "$pass1_s" >> "$phases"
printf 'pytest pass 2 (.venv-vllm033, beside pass 1)\t%s\n' "$pass2_s" >> "$phases"
echo "==> phase times (s):"
awk -F'\t' '{ printf "    %-46s %6d\n", $1, $2 }' "$phases"
[ $pass1 -eq 0 ] && [ $pass2 -eq 0 ]
