"""vllm-router with its API key read from a file:

    python -m dflash_ops.local.router_launch --api-key-file FILE ARGS...

runs `vllm-router ARGS... --api-key KEY` in this process. /proc/PID/cmdline shows what exec was
given, so the key never appears there; vllm-router reads its arguments from sys.argv (and then
retitles the process `vllm::router`)."""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] != "--api-key-file":
        sys.exit("usage: python -m dflash_ops.local.router_launch --api-key-file FILE ARGS...")
    try:
        key = Path(argv[1]).read_text().strip()
    except OSError as err:
        sys.exit(f"router_launch: cannot read the key file {argv[1]}: {err.strerror}")
    from vllm_router.launch_router import main as launch_router  # type: ignore[import-untyped]

    sys.argv = ["vllm-router", *argv[2:], "--api-key", key]
    launch_router()


if __name__ == "__main__":
    main(sys.argv[1:])
