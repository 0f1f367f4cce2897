"""Wait until the Ray cluster has the nodes and GPUs vLLM needs; exit 1 naming what is missing.

Environment: DFLASH_RAY_EXPECTED_NODES, DFLASH_RAY_EXPECTED_GPUS, DFLASH_RAY_JOIN_TIMEOUT_S,
RAY_ADDRESS (set by KubeRay; "auto" otherwise).
"""

import logging
import os
import sys
import time

import ray


def alive_nodes_and_gpus() -> tuple[int, float]:
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return len(nodes), sum(n.get("Resources", {}).get("GPU", 0.0) for n in nodes)


def main() -> int:
    want_nodes = int(os.environ["DFLASH_RAY_EXPECTED_NODES"])
    want_gpus = float(os.environ["DFLASH_RAY_EXPECTED_GPUS"])
    timeout = float(os.environ.get("DFLASH_RAY_JOIN_TIMEOUT_S", "900"))
    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), logging_level=logging.WARNING)
    started = time.monotonic()
    last_report = -1.0
    try:
        while True:
            nodes, gpus = alive_nodes_and_gpus()
            waited = time.monotonic() - started
            if nodes >= want_nodes and gpus >= want_gpus:
                print(
                    f"[ray-head] {nodes}/{want_nodes} nodes and {gpus:g}/{want_gpus:g} GPUs "
                    f"joined after {waited:.0f}s",
                    flush=True,
                )
                return 0
            if waited > timeout:
                print(
                    f"[ray-head] error: after {timeout:.0f}s only {nodes}/{want_nodes} nodes and "
                    f"{gpus:g}/{want_gpus:g} GPUs joined; check the worker pods "
                    "(kubectl get pods -l dflash-serve.io/component=ray-worker) and "
                    "distributed.joinTimeoutSeconds",
                    file=sys.stderr,
                    flush=True,
                )
                return 1
            if waited - last_report >= 10:
                last_report = waited
                print(
                    f"[ray-head] waiting for the cluster: {nodes}/{want_nodes} nodes, "
                    f"{gpus:g}/{want_gpus:g} GPUs ({waited:.0f}s)",
                    flush=True,
                )
            time.sleep(2)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
