#!/usr/bin/env bash
# `make demo` after its set-up: speculation against no speculation on the paying pair (a ~180M
# target and a draft of its first 2 layers, built on the fly), side by side in one run:
#   1. an engine without speculation (`off`) on 127.0.0.1:8001, benchmarked, then stopped;
#   2. the local stack with the draft (k=DEMO_K) on :8000 with its sidecar and Prometheus,
#      benchmarked and left running;
#   3. `bench compare`: the two runs with the ratio to `off` per load level.
# Both engines run eager (no torch.compile): each starts in about 30 s on 2 cores.
#
#   DEMO_K=4 DEMO_CONCURRENCY=1,8 bash ops/setup/demo.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
CLI=.venv/bin/dflash-serve
K="${DEMO_K:-4}"
LEVELS="${DEMO_CONCURRENCY:-1,8}"
OUT="${DEMO_OUT:-bench-out}"
OFF_STATE=.local-stack-off
# Greedy and to 64 tokens, as the reference measurement (DEMO_SAMPLING="--temperature 1" shows
# what sampled traffic gets: speculation buys much less there).
read -r -a SAMPLING <<<"${DEMO_SAMPLING:---temperature 0 --ignore-eos}"
WORKLOAD=(--concurrency "$LEVELS" --duration 12 --max-tokens 64 --repeats 3 "${SAMPLING[@]}")
say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

started=$SECONDS
cleanup_off() { "$CLI" local down --state-dir "$OFF_STATE" >/dev/null 2>&1 || true; }
trap cleanup_off EXIT

# Both stacks use one copy of the pair (built by the first `local up`).
mkdir -p .local-stack/models "$OFF_STATE"
[[ -e "$OFF_STATE/models" ]] || ln -s "$ROOT/.local-stack/models" "$OFF_STATE/models"

say "1/3 the paying pair without speculation (off), on 127.0.0.1:8001"
"$CLI" local up --models paying --method off --enforce-eager --no-prometheus \
  --state-dir "$OFF_STATE" --engine-port 8001 --sidecar-port 9101
"$CLI" bench --base-url http://127.0.0.1:8001 "${WORKLOAD[@]}" --out "$OUT/off"
cleanup_off

say "2/3 the same target with its draft (draft_model, k=$K), on 127.0.0.1:8000"
"$CLI" local up --models paying --k "$K" --enforce-eager
"$CLI" bench --base-url http://127.0.0.1:8000 "${WORKLOAD[@]}" --out "$OUT/draft_model-k$K"

say "3/3 side by side (ratios to off)"
"$CLI" bench compare "$OUT/off" "$OUT/draft_model-k$K" | tee "$OUT/compare.md"
say "done in $((SECONDS - started)) s after set-up; tables and acceptance plots in $OUT/"
