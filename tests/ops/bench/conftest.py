"""OpenAI-compatible test servers on real sockets: the instant fake server, and scripted ones."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny models' tokenizer (trained here, no hub): what the random and shared-prefix
    prompt sets are sized in when the server under test has none to offer."""
    from dflash_ops.local.tiny_model import train_tokenizer

    directory = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(directory, 2048)
    return directory


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: Path) -> Any:
    from dflash_ops.bench.core.token_counter import load_tokenizer

    return load_tokenizer(str(tokenizer_dir))
