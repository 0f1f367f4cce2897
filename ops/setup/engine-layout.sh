#!/usr/bin/env bash
# The local stack's CPU engine in its two process layouts, side by side on this machine:
#   uni  what `local up` runs: VLLM_ENABLE_V1_MULTIPROCESSING=0, the engine core runs the model
#        on OMP_NUM_THREADS threads (stack.engine_env)
#   mp   vLLM's CPU default: the model in a worker process beside the engine core
# Each round starts ENGINES engines at once in each layout (the layouts alternate), waits for
# `local up` (tiny pair, --enforce-eager, no Prometheus), benchmarks every engine at concurrency
# 1 and 4 (64 tokens, 12 requests per level) while the others do the same, then stops them.
# Prints one line per engine: layout, round, start seconds, output tok/s at each level.
#
#   ROUNDS=2 ENGINES=1 bash ops/setup/engine-layout.sh   (ENGINES=2: two side by side)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
CLI="$ROOT/.venv/bin/dflash-serve"
ROUNDS="${ROUNDS:-2}"
ENGINES="${ENGINES:-1}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/engine-layout.XXXXXX")"
mkdir -p "$WORK/models"
trap 'for d in "$WORK"/*/; do [ -f "$d/state.json" ] && "$CLI" local down --state-dir "$d" >/dev/null 2>&1; done' EXIT

free_port() { "$ROOT/.venv/bin/python" -c 'from dflash_ops.loopback import free_port; print(free_port())'; }

one() {  # layout round index: start, bench, stop; prints the engine's line
    local layout=$1 round=$2 i=$3 dir="$WORK/$1-$2-$3" port sidecar t0 t1 env=()
    mkdir -p "$dir" && ln -s "$WORK/models" "$dir/models"
    port=$(free_port) && sidecar=$(free_port)
    [ "$layout" = mp ] && env=(VLLM_ENABLE_V1_MULTIPROCESSING=1)
    t0=$(date +%s.%N)
    env "${env[@]}" "$CLI" local up --state-dir "$dir" --enforce-eager --no-prometheus \
        --engine-port "$port" --sidecar-port "$sidecar" >"$dir/up.log" 2>&1 \
        || { echo "$layout round $round: local up failed, see $dir/up.log" >&2; return 1; }
    t1=$(date +%s.%N)
    "$CLI" bench --base-url "http://127.0.0.1:$port" --concurrency 1,4 --num-requests 12 \
        --repeats 1 --max-tokens 64 --out "$dir/bench" >"$dir/bench.log" 2>&1 \
        || { echo "$layout round $round: bench failed, see $dir/bench.log" >&2; return 1; }
    "$CLI" local down --state-dir "$dir" >/dev/null 2>&1
    "$ROOT/.venv/bin/python" - "$layout" "$round" "$t0" "$t1" "$dir/bench/results.json" <<'EOF'
import json, sys
layout, rnd, t0, t1, results = sys.argv[1:]
levels = json.load(open(results))["levels"]
rates = ", ".join(f"c{lv['concurrency']} {lv['output_tokens_per_s']['mean']:.0f}" for lv in levels)
print(f"{layout:4} round {rnd}: started in {float(t1) - float(t0):5.1f} s; output tok/s {rates}")
EOF
}

# The models first (built once, shared), so no start below includes building them.
"$ROOT/.venv/bin/python" -c '
import sys
from pathlib import Path
from dflash_ops.local import stack
stack.ensure_models(stack.StackConfig(state_dir=Path(sys.argv[1])))' "$WORK/models/.."
echo "==> $ENGINES engine(s) at once per layout, $ROUNDS round(s); work: $WORK"
for round in $(seq 1 "$ROUNDS"); do
    for layout in uni mp; do
        pids=()
        for i in $(seq 1 "$ENGINES"); do one "$layout" "$round" "$i" & pids+=($!); done
        for pid in "${pids[@]}"; do wait "$pid"; done
    done
done
