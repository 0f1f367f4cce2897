"""OpenAI-compatible test servers on real sockets: the instant fake server, and scripted ones."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(module: str, *args: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", module, "--port", str(port), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1)
            return process, url
        except OSError:
            assert process.poll() is None and time.monotonic() < deadline, f"{module} did not start"
            time.sleep(0.1)


@pytest.fixture(scope="module")
def instant_server() -> Iterator[str]:
    process, url = start_server("dflash_ops.bench.fake_server")
    yield url
    process.terminate()
    process.wait(timeout=10)


@pytest.fixture(scope="module")
def scripted_server() -> Iterator[str]:
    process, url = start_server("tests.ops.bench.scripted_server")
    yield url
    process.terminate()
    process.wait(timeout=10)
