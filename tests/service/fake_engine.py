"""A scriptable stand-in for vLLM's HTTP surface, for unit tests of the monitor (httpx mock).

Pages are either recorded real expositions or rendered from counters in vLLM's own format
(`vllm_page`), so a test can script any sequence: growth, restarts, NaN, duplicates, cuts.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx


@dataclass
class Counters:
    """Cumulative spec-decode counters of one engine, as vLLM exports them."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_pos: list[float] = field(default_factory=lambda: [0.0] * 4)
    generation: float = 0.0
    running: float = 0.0

    def step(self, drafts: int, accepted_per_pos: list[int], extra_tokens: int = 0) -> None:
        """`drafts` drafts of k tokens; accepted_per_pos[i] of them accepted position i."""
        k = len(self.per_pos)
        assert len(accepted_per_pos) == k and all(a <= drafts for a in accepted_per_pos)
        self.drafts += drafts
        self.draft_tokens += drafts * k
        self.accepted += sum(accepted_per_pos)
        self.per_pos = [p + a for p, a in zip(self.per_pos, accepted_per_pos, strict=True)]
        self.generation += drafts + sum(accepted_per_pos) + extra_tokens


def vllm_page(c: Counters, model: str = "tiny", engine: str = "0") -> str:
    """A /metrics page in vLLM's format for these counters (the families the sidecar reads,
    with HELP/TYPE lines, `_created` samples and a histogram around them)."""
    labels = f'engine="{engine}",model_name="{model}"'
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} {c.running}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{labels}}} 0.0",
    ]
    for name, value in (
        ("vllm:spec_decode_num_drafts", c.drafts),
        ("vllm:spec_decode_num_draft_tokens", c.draft_tokens),
        ("vllm:spec_decode_num_accepted_tokens", c.accepted),
        ("vllm:generation_tokens", c.generation),
    ):
        lines += [
            f"# HELP {name}_total {name}.",
            f"# TYPE {name}_total counter",
            f"{name}_total{{{labels}}} {value}",
            f"{name}_created{{{labels}}} 1.7959859189197903e+09",
        ]
    lines += [
        "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per position.",
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
    ]
    for i, value in enumerate(c.per_pos):
        lines.append(
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{i}"}} {value}'
        )
    lines += [
        "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.",
        "# TYPE vllm:time_to_first_token_seconds histogram",
        f'vllm:time_to_first_token_seconds_bucket{{{labels},le="0.1"}} 3.0',
        f'vllm:time_to_first_token_seconds_bucket{{{labels},le="+Inf"}} 4.0',
        f"vllm:time_to_first_token_seconds_count{{{labels}}} 4.0",
        f"vllm:time_to_first_token_seconds_sum{{{labels}}} 0.5",
    ]
    return "\n".join(lines) + "\n"


class _Trickle(httpx.AsyncByteStream):
    def __init__(self, data: bytes, delay_s: float) -> None:
        self.data, self.delay_s = data, delay_s

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for byte in self.data:
            await asyncio.sleep(self.delay_s)
            yield bytes([byte])


class FakeEngine:
    def __init__(self, metrics: str) -> None:
        self.metrics = metrics
        self.health_status = 200
        self.completion_status = 200
        self.completion_delay_s = 0.0  # a busy engine answers the canary late
        self.reachable = True
        self.health_trickle_s: float | None = None  # answer /health one byte at a time
        self.completions = 0
        self.requests: list[str] = []

    async def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request.url.path)
        if not self.reachable:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/health":
            if self.health_trickle_s is not None:
                return httpx.Response(
                    self.health_status, stream=_Trickle(b"x" * 1000, self.health_trickle_s)
                )
            return httpx.Response(self.health_status)
        if request.url.path == "/metrics":
            return httpx.Response(200, text=self.metrics)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}]})
        if request.url.path == "/v1/completions":
            self.completions += 1
            if self.completion_delay_s:
                await asyncio.sleep(self.completion_delay_s)
            if self.completion_status != 200:
                return httpx.Response(self.completion_status, text="EngineCore died")
            return httpx.Response(200, json={"choices": [{"text": "!"}]})
        return httpx.Response(404)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url="http://engine", transport=httpx.MockTransport(self.handler), timeout=1.0
        )
