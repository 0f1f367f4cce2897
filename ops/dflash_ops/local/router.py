"""vLLM's router (the `vllm-router` package) on loopback: its command line and its binary."""

from __future__ import annotations

import importlib.util
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


def keyed_router_argv(argv: list[str], key_file: Path) -> list[str]:
    """`argv` (router_argv's) run with `--api-key` read from `key_file` by this Python
    (dflash_ops.local.router_launch): the key never appears on a command line, where every
    local user can read it (ps, /proc/PID/cmdline)."""
    if importlib.util.find_spec("vllm_router") is None:
        raise UserError("vllm-router is not installed: pip install 'dflash-serve[router]'")
    launcher = [sys.executable, "-m", "dflash_ops.local.router_launch"]
    return [*launcher, "--api-key-file", str(key_file.resolve()), *argv[1:]]
