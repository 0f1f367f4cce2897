"""OpenAI-compatible test servers on real sockets: the instant fake server, and scripted ones."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from dflash_ops.loopback import start_server


def serve(module: str) -> Iterator[str]:
    process, url = start_server(module)
    yield url
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:  # a handler still holds a hung request
        process.kill()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def instant_server() -> Iterator[str]:
    yield from serve("dflash_ops.bench.fake_server")


@pytest.fixture(scope="module")
def scripted_server() -> Iterator[str]:
    yield from serve("tests.ops.bench.scripted_server")
