"""Servers on this machine's loopback: a free port, and a `python -m` server started on one."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request

from dflash_ops.errors import UserError


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_ports_in_a_row(count: int) -> int:
    """The first of `count` consecutive free ports on 127.0.0.1 (the local stack's replicas
    listen on a base port + i)."""
    for _ in range(50):
        base = free_port()
        if base + count > 65536:
            continue
        try:
            for port in range(base + 1, base + count):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no {count} free ports in a row on 127.0.0.1")


def start_server(
    module: str, *args: str, timeout_s: float = 30.0
) -> tuple[subprocess.Popen[bytes], str]:
    """`python -m MODULE --port PORT ARGS...` on a free port, once its /health answers; the
    process and its URL. A server that exits or stays silent is killed and named."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", module, "--port", str(port), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1)
            return process, url
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise UserError(f"{module} did not start: no answer on {url}/health") from None
            time.sleep(0.1)
