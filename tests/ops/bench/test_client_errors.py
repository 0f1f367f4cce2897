"""The benchmark's clear messages: unreachable server, wrong model, no speculative metrics."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest
from dflash_ops.bench.client import Endpoint
from dflash_ops.bench.runner import spec_delta
from dflash_ops.errors import UserError

from tests.service.conftest import FIXTURES
from tests.service.fake_engine import FakeEngine


@pytest.fixture(scope="module")
def after_text() -> str:
    return (FIXTURES / "vllm_cpu_after.prom").read_text()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_server_names_the_url() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    endpoint = Endpoint(url, timeout_s=2)
    with pytest.raises(UserError, match=f"cannot reach {url}/v1/models"):
        asyncio.run(endpoint.check_model("tiny"))


def test_wrong_model_lists_what_is_served(after_text: str) -> None:
    engine = FakeEngine(after_text)
    endpoint = Endpoint("http://engine", transport=httpx.MockTransport(engine.handler))
    with pytest.raises(
        UserError, match="model 'qwen' is not served at http://engine; it serves: tiny"
    ):
        asyncio.run(endpoint.check_model("qwen"))


def test_server_without_speculative_metrics(after_text: str) -> None:
    plain = "\n".join(x for x in after_text.splitlines() if "spec_decode" not in x)
    engine = FakeEngine(plain)
    endpoint = Endpoint("http://engine", transport=httpx.MockTransport(engine.handler))
    assert asyncio.run(endpoint.counters()) is None
    assert spec_delta(None, None) is None


def test_counters_sum_series_and_the_kv_capacity(after_text: str) -> None:
    engine = FakeEngine(after_text)
    endpoint = Endpoint("http://engine", transport=httpx.MockTransport(engine.handler))
    counters = asyncio.run(endpoint.counters())
    assert counters is not None and counters.drafts > 0
    assert asyncio.run(endpoint.kv_cache_tokens()) == 4096 * 128  # num_gpu_blocks x block_size
