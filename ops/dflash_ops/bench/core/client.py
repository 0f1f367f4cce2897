"""Talk to the endpoint: streamed chat completions (sampled as the run says; greedy for the
losslessness check), the model list, and /metrics.

Streaming requests record what a serving benchmark reports per request: time to the first
content chunk (TTFT), the gaps between chunks (inter-token latency: vLLM streams one chunk per
engine step, so with speculative decoding a chunk may carry several tokens), the end, and the
output token count from the final usage chunk. The SSE stream is split on raw bytes and only
complete events are decoded, so the client stays far from being the bottleneck.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
from dflash_sidecar import metrics_parser

from dflash_ops.bench.core.results import DEFAULT_REQUEST_TIMEOUT_S
from dflash_ops.bench.core.sampling import Sampling
from dflash_ops.errors import UserError
from dflash_ops.urls import check_http_url

_CACHE_INFO = re.compile(r"^vllm:cache_config_info\{(.*)\}")
_PREFIX_HITS = re.compile(r"^vllm:prefix_cache_(hits|queries)_total\{[^}]*\}\s+(\S+)", re.M)
_SUCCESS = re.compile(r"^vllm:request_success_total(?:\{[^}]*\})?\s+(\S+)", re.M)
CONNECT_TIMEOUT_S = 10.0


def check_base_url(url: str) -> str:
    """`url` without a trailing slash, or a UserError naming what is wrong with it."""
    return check_http_url(url)


ErrorKind = Literal["http", "timeout", "connection", "protocol"]


ApiPath = Literal["/v1/chat/completions", "/v1/completions"]
CHAT_PATH: ApiPath = "/v1/chat/completions"
COMPLETIONS_PATH: ApiPath = "/v1/completions"


# Below uvicorn's timeout_keep_alive (5 s), the server vLLM's API runs on.
KEEPALIVE_S = 3.0

# A /metrics read has its own short deadline, apart from --request-timeout: a replica whose
# page hangs is left out of that snapshot (and named), not waited for for minutes.
METRICS_TIMEOUT_S = 5.0
METRICS_TIMEOUT = aiohttp.ClientTimeout(total=METRICS_TIMEOUT_S)


def usage_count(usage: Any, key: str) -> int:
    """A usage field as a count: a whole number >= 0 (absent or null: 0); anything else is a
    malformed stream (ValueError), never believed."""
    value = usage.get(key) if isinstance(usage, dict) else None
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"usage.{key} {value!r} is not a count")
    if not math.isfinite(value) or value < 0 or value != int(value):
        raise ValueError(f"usage.{key} {value!r} is not a count")
    return int(value)


def impossible_usage(tokens: int, max_tokens: int) -> str | None:
    """Why a usage count cannot be what was asked for, or None. The request's max_tokens is the
    only sound bound: the streamed chunks are not one, since vLLM streams no chunk for tokens
    whose text it holds back (an unfinished UTF-8 character, a possible stop string, a skipped
    special token) and sends their text, if any, with a later token's."""
    if tokens > max_tokens:
        return f"impossible usage: {tokens} completion tokens for max_tokens {max_tokens}"
    return None


def prompt_text(messages: list[dict[str, str]]) -> str:
    """A chat's messages as one completions prompt: their contents, a blank line between."""
    return "\n\n".join(message["content"] for message in messages)


@dataclass
class RequestRecord:
    """What one streamed request measured."""

    ok: bool
    start: float = 0.0  # perf_counter seconds
    ttft_s: float | None = None
    end: float = 0.0
    output_tokens: int = 0
    prompt_tokens: int = 0
    chunk_times_s: list[float] = field(default_factory=list)  # content chunks, after start
    error: str | None = None
    error_kind: ErrorKind | None = None
    token_count_source: Literal["usage", "tokenizer"] = "usage"
    prompt_id: str = ""
    category: str | None = None  # the prompt's category (spec_bench), if it has one
    seed: int | None = None  # the sampling seed the request was sent, if any
    # sha256 of the streamed text (its first 16 hex digits): two runs' outputs compared
    # without keeping them (a seeded sampled run repeats where the engine honours seeds).
    output_digest: str | None = None

    @property
    def latency_s(self) -> float:
        return self.end - self.start

    @property
    def chunk_gaps_s(self) -> list[float]:
        """Gaps between streamed content chunks (inter-token latency, per engine step)."""
        times = self.chunk_times_s
        return [b - a for a, b in itertools.pairwise(times)]

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first (e2e - TTFT) / (tokens - 1)."""
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


class Endpoint:
    def __init__(
        self,
        base_url: str,
        timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        api_key: str | None = None,
        token_counter: Callable[[str], int] | None = None,
        metrics_urls: list[str] | None = None,
        sampling: Sampling | None = None,
        api_path: ApiPath = CHAT_PATH,
    ) -> None:
        self.base_url = check_base_url(base_url)
        # The OpenAI API the requests go to: chat (the server applies the chat template) or
        # completions (the prompt as written, as vllm bench serve's default backend sends it).
        self.api_path = api_path
        self.sampling = sampling if sampling is not None else Sampling.recorded_before_sampling()
        # Engines whose counters are summed (replicas behind a router); none: the target's own.
        self.metrics_urls = [check_base_url(url) for url in metrics_urls or []]
        self.timeout_s = timeout_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, connect=CONNECT_TIMEOUT_S)
        # Counts output tokens from the streamed text when a server sends no usage chunk.
        self.token_counter = token_counter
        # vLLM --api-key guards /v1/...; /metrics and /health ignore the header.
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self.timeout,
                headers=self.headers,
                # An idle connection is reused only while the server still keeps it: uvicorn
                # (vLLM's API server) closes one idle for 5 s, and aiohttp keeps it 15 s by
                # default, so a request after a pause (a tokenizer loading, a snapshot) went out
                # on a closed connection: ServerDisconnectedError, a request lost.
                connector=aiohttp.TCPConnector(
                    limit=0, force_close=False, keepalive_timeout=KEEPALIVE_S
                ),
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _get(
        self, path: str, timeout: aiohttp.ClientTimeout | None = None
    ) -> tuple[int, str]:
        try:
            async with self.session.get(self.base_url + path, timeout=timeout) as reply:
                return reply.status, await reply.text()
        except (aiohttp.ClientError, TimeoutError) as err:
            raise UserError(
                f"cannot reach {self.base_url}{path}: {type(err).__name__} {err}; is the engine "
                "running (dflash-serve local status)?"
            ) from None

    async def models(self) -> list[str]:
        return [str(entry["id"]) for entry in await self._model_entries()]

    async def model_root(self, model: str) -> str:
        """Where the server loaded `model` from (vLLM's /v1/models `root`: a directory or a hub
        id), to load its tokenizer; its id when the server does not say."""
        for entry in await self._model_entries():
            if entry["id"] == model:
                return str(entry.get("root") or model)
        return model

    async def _model_entries(self) -> list[dict[str, Any]]:
        status, text = await self._get("/v1/models")
        if status == 401:
            which = "is not accepted" if self.headers else "is required"
            raise UserError(
                f"{self.base_url}/v1/models answered 401 Unauthorized: an API key {which}; pass "
                "--api-key or set OPENAI_API_KEY"
            )
        if status != 200:
            raise UserError(f"{self.base_url}/v1/models answered {status}: {text[:200]}")
        try:
            entries = list(json.loads(text).get("data", []))
            if not all(isinstance(m, dict) and "id" in m for m in entries):
                raise TypeError
            return entries
        except (json.JSONDecodeError, AttributeError, KeyError, TypeError):
            raise UserError(
                f"{self.base_url}/v1/models is not an OpenAI model list: {text[:120]!r}"
            ) from None

    async def model_to_use(self, model: str | None) -> str:
        """`model`, checked to be served here; None: the first model served."""
        if model is not None:
            await self.check_model(model)
            return model
        served = await self.models()
        if not served:
            raise UserError(f"{self.base_url} serves no model")
        return served[0]

    async def check_model(self, model: str) -> None:
        served = await self.models()
        if model not in served:
            raise UserError(
                f"model {model!r} is not served at {self.base_url}; it serves: "
                f"{', '.join(served) or 'nothing'}"
            )

    async def metrics_text(self) -> str | None:
        """The target's /metrics page, or None if it does not answer within METRICS_TIMEOUT_S
        (a hung page must not stall the run for the request timeout)."""
        try:
            status, text = await self._get("/metrics", METRICS_TIMEOUT)
        except UserError:
            return None
        return text if status == 200 else None

    async def metrics_pages(self) -> dict[str, str | None]:
        """The /metrics page of every engine counted: each --metrics-url, or the target."""
        if not self.metrics_urls:
            return {self.base_url: await self.metrics_text()}
        pages: dict[str, str | None] = {}
        for url in self.metrics_urls:
            try:
                async with self.session.get(url + "/metrics", timeout=METRICS_TIMEOUT) as reply:
                    pages[url] = await reply.text() if reply.status == 200 else None
            except (aiohttp.ClientError, TimeoutError):
                pages[url] = None
        return pages

    async def alive(self) -> bool:
        """Whether the server still answers /health at all (any status but a dead socket)."""
        try:
            async with self.session.get(
                self.base_url + "/health", timeout=aiohttp.ClientTimeout(total=CONNECT_TIMEOUT_S)
            ) as reply:
                await reply.read()
                return True
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def counters(self) -> metrics_parser.SeriesSample | None:
        """Speculative counters summed over every series of every engine counted; None if they
        have none."""
        return self.counters_of(*(await self.metrics_pages()).values())

    @staticmethod
    def counters_of(*texts: str | None) -> metrics_parser.SeriesSample | None:
        samples = [
            s
            for text in texts
            if text is not None
            for s in metrics_parser.parse(text).series.values()
            if s.has_spec_decode
        ]
        if not samples:
            return None
        total = metrics_parser.SeriesSample(has_spec_decode=True)
        for s in samples:
            total.drafts += s.drafts
            total.draft_tokens += s.draft_tokens
            total.accepted += s.accepted
            total.generation_tokens += s.generation_tokens
            for i, v in s.accepted_per_pos.items():
                total.accepted_per_pos[i] = total.accepted_per_pos.get(i, 0.0) + v
        return total

    async def prefix_cache(self) -> tuple[float, float] | None:
        """(hit tokens, queried tokens) of vLLM's prefix cache, summed; None if not exported."""
        return self.prefix_cache_of(await self.metrics_text())

    @staticmethod
    def prefix_cache_of(*texts: str | None) -> tuple[float, float] | None:
        totals = {"hits": 0.0, "queries": 0.0}
        found = False
        for text in texts:
            for kind, value in _PREFIX_HITS.findall(text or ""):
                totals[kind] += float(value)
                found = True
        return (totals["hits"], totals["queries"]) if found else None

    @staticmethod
    def finished_requests_of(text: str | None) -> float | None:
        """Requests the engine finished (vllm:request_success_total over every reason)."""
        values = _SUCCESS.findall(text or "")
        return sum(float(v) for v in values) if values else None

    async def kv_cache_tokens(self) -> int | None:
        text = await self.metrics_text()
        for line in (text or "").splitlines():
            match = _CACHE_INFO.match(line)
            if match:
                labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
                blocks, size = labels.get("num_gpu_blocks"), labels.get("block_size")
                if blocks and size and blocks.isdigit() and size.isdigit():
                    return int(blocks) * int(size)
        return None

    async def stream_chat(
        self, model: str, messages: list[dict[str, str]], max_tokens: int, seed: int | None = None
    ) -> RequestRecord:
        """One streamed request, sampled as self.sampling says (`seed`: the request's, sent
        when it samples); never raises for a failed request (recorded instead)."""
        chat = self.api_path == CHAT_PATH
        body = {
            "model": model,
            **({"messages": messages} if chat else {"prompt": prompt_text(messages)}),
            "max_tokens": max_tokens,
            **self.sampling.body(seed),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        record = RequestRecord(ok=False, start=time.perf_counter(), seed=body.get("seed"))
        text: list[str] = []
        try:
            async with self.session.post(self.base_url + self.api_path, json=body) as reply:
                if reply.status != 200:
                    record.error = f"HTTP {reply.status}: {(await reply.text())[:200]}"
                    record.error_kind = "http"
                    record.end = time.perf_counter()
                    return record
                buffer = b""
                async for data in reply.content.iter_any():
                    buffer += data
                    while b"\n\n" in buffer:
                        event, buffer = buffer.split(b"\n\n", 1)
                        event = event.strip()
                        if not event.startswith(b"data: "):
                            continue
                        payload = event[6:]
                        if payload == b"[DONE]":
                            continue
                        now = time.perf_counter()
                        chunk = json.loads(payload)
                        choices = chunk.get("choices")
                        if choices:
                            delta = choices[0].get("delta") or {}
                            content = (
                                delta.get("content")
                                or delta.get("reasoning_content")
                                or delta.get("reasoning")
                                if chat
                                else choices[0].get("text")
                            )
                            if content:
                                record.chunk_times_s.append(now - record.start)
                                text.append(content)
                        usage = chunk.get("usage")
                        if usage:
                            record.output_tokens = usage_count(usage, "completion_tokens")
                            record.prompt_tokens = usage_count(usage, "prompt_tokens")
        except TimeoutError:
            record.error = f"no answer within --request-timeout {self.timeout_s:g} s"
            record.error_kind = "timeout"
            record.end = time.perf_counter()
            return record
        except aiohttp.ClientError as err:
            record.error = f"{type(err).__name__}: {err}"[:300]
            record.error_kind = "connection"
            record.end = time.perf_counter()
            return record
        except (
            json.JSONDecodeError, ValueError, TypeError, AttributeError, KeyError, IndexError,
            OverflowError,
        ) as err:  # fmt: skip
            # Whatever a hostile or broken server sends fails this request, never the run.
            record.error = f"a malformed stream: {type(err).__name__}: {err}"[:300]
            record.error_kind = "protocol"
            record.end = time.perf_counter()
            return record
        if text:
            record.output_digest = hashlib.sha256("".join(text).encode()).hexdigest()[:16]
        if record.chunk_times_s:
            record.ttft_s = record.chunk_times_s[0]
            record.end = record.start + record.chunk_times_s[-1]
        else:
            record.end = time.perf_counter()
        if record.ttft_s is not None and record.output_tokens == 0:
            if self.token_counter is None:
                record.error = (
                    "the stream carried no usage chunk (stream_options.include_usage): pass "
                    "--tokenizer to count output tokens with the model's tokenizer"
                )
                record.error_kind = "protocol"
                return record
            record.output_tokens = self.token_counter("".join(text))
            record.token_count_source = "tokenizer"
        record.ok = record.ttft_s is not None and record.output_tokens > 0
        if not record.ok:
            record.error = "the stream carried no content"
            record.error_kind = "protocol"
        elif record.token_count_source == "usage" and (
            impossible := impossible_usage(record.output_tokens, max_tokens)
        ):
            # Believed, it would make a figure no stream can give (tok/s of a billion tokens).
            record.ok, record.error, record.error_kind = False, impossible, "protocol"
        return record

    async def chat_token_ids(
        self,
        model: str,
        messages: list[dict[str, str]],
        max_tokens: int,
        sampling: Sampling | None = None,
        seed: int | None = None,
    ) -> list[int]:
        """Completion token ids of one request to max_tokens (for the lossless checks): greedy,
        or sampled as `sampling` says with the request seed `seed`."""
        fields = sampling.body(seed) if sampling is not None else {"temperature": 0}
        chat = self.api_path == CHAT_PATH
        body = {
            "model": model,
            **({"messages": messages} if chat else {"prompt": prompt_text(messages)}),
            "max_tokens": max_tokens,
            **fields,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        try:
            async with self.session.post(self.base_url + self.api_path, json=body) as reply:
                text = await reply.text()
                if reply.status != 200:
                    raise UserError(
                        f"{self.base_url}/v1/chat/completions answered {reply.status}: {text[:300]}"
                    )
        except (aiohttp.ClientError, TimeoutError) as err:
            raise UserError(f"cannot reach {self.base_url}: {type(err).__name__} {err}") from None
        try:
            choice = json.loads(text)["choices"][0]
        except (json.JSONDecodeError, KeyError, IndexError, TypeError):
            raise UserError(f"{self.base_url} answered a non-OpenAI body: {text[:120]!r}") from None
        return [int(t) for t in choice.get("token_ids") or []]
