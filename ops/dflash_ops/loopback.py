"""Servers on this machine's loopback: a free port, and a `python -m` server started on one."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from dflash_ops.errors import UserError

# Ports below the kernel's ephemeral range are never handed out for a socket bound to port 0 or
# for an outgoing connection: a port picked there for a server that starts minutes later (the
# router after the engines) cannot be taken in between by one of the engines' own sockets.
_PICK_FROM = 15000
_random = random.SystemRandom()  # not the global random: hypothesis seeds that one
# Never the same port twice in one process: two servers asked for in a row get two ports.
_handed_out: set[int] = set()


def _ephemeral_low(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, below the ephemeral range
    when the kernel says where that is (else one the kernel picks)."""
    low = _ephemeral_low()
    for _ in range(200 if low > _PICK_FROM + 1000 else 0):
        port = _random.randrange(_PICK_FROM, low)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
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
                if port in _handed_out:
                    raise OSError(f"port {port} was handed out before")
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        _handed_out.update(range(base, base + count))
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
