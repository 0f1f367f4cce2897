"""vLLM's router (the `vllm-router` package) on loopback: its command line and its binary."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from dflash_ops.errors import UserError

# What vllm-router shows in /proc/<pid>/cmdline once started (it calls setproctitle).
PROCESS_TITLE = "vllm::router"


def router_binary() -> str:
    """The vllm-router of this Python's environment, else the one on PATH."""
    beside = Path(sys.executable).with_name("vllm-router")
    found = str(beside) if beside.exists() else shutil.which("vllm-router")
    if found is None:
        raise UserError("vllm-router is not installed: pip install 'dflash-serve[router]'")
    return found


def router_argv(
    workers: list[str],
    policy: str,
    port: int,
    metrics_port: int,
    extra: list[str] | None = None,
    host: str = "127.0.0.1",
) -> list[str]:
    return [
        router_binary(),
        "--host", host, "--port", str(port), "--worker-urls", *workers,
        "--policy", policy, "--prometheus-host", host,
        "--prometheus-port", str(metrics_port), "--health-check-interval-secs", "2",
        *(extra or []),
    ]  # fmt: skip
