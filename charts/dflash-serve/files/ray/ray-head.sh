#!/bin/bash
# Entry point of the Ray head container: ray-head.sh vllm serve MODEL [ARGS...]
#
# KubeRay puts its generated `ray start --head ...` in $KUBERAY_GEN_RAY_START_CMD, and that
# command always carries `--block`: chained after it, vLLM would never start. So Ray starts
# here without `--block` (it daemonises), this script waits until the expected nodes and GPUs
# have joined, then execs vLLM in place of itself. When vLLM exits (e.g. a worker died and its
# Ray executor shut down), the container exits and Kubernetes restarts it.
set -euo pipefail

say() { echo "[ray-head] $*"; }

if [[ -z "${KUBERAY_GEN_RAY_START_CMD:-}" ]]; then
  say "error: KUBERAY_GEN_RAY_START_CMD is not set; this script runs in a KubeRay head pod" \
      "with the annotation ray.io/overwrite-container-cmd: \"true\"" >&2
  exit 2
fi
if [[ $# -eq 0 ]]; then
  say "error: no command to run once the cluster formed (expected: vllm serve ...)" >&2
  exit 2
fi

start_cmd="$(sed -E 's/(^|[[:space:]])--block([[:space:]]|$)/ /g' <<<"$KUBERAY_GEN_RAY_START_CMD")"
# KubeRay raises the open-files limit the same way before its own `ray start`.
ulimit -n "${RAY_START_ULIMIT_OPEN_FILES:-65536}" 2>/dev/null \
  || say "could not raise the open-files limit to ${RAY_START_ULIMIT_OPEN_FILES:-65536}; keeping $(ulimit -n)"
say "starting Ray: $start_cmd"
eval "$start_cmd"

python3 "$(dirname "${BASH_SOURCE[0]}")/wait-for-ray.py"

say "cluster formed; exec $*"
exec "$@"
