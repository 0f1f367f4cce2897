"""Talk to the endpoint: chat completions, the model list, and /metrics counters."""

from __future__ import annotations

import re
import time

import httpx
from dflash_sidecar import exposition

from dflash_ops.errors import UserError

_CACHE_INFO = re.compile(r"^vllm:cache_config_info\{(.*)\}")


class Endpoint:
    def __init__(
        self,
        base_url: str,
        timeout_s: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.client = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=timeout_s,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
            transport=transport,
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    async def _get(self, path: str) -> httpx.Response:
        try:
            return await self.client.get(path)
        except httpx.ConnectError as err:
            raise UserError(
                f"cannot reach {self.base_url}{path}: {err}; is the engine running "
                "(dflash-serve local status)?"
            ) from None

    async def models(self) -> list[str]:
        reply = await self._get("/v1/models")
        if reply.status_code != 200:
            raise UserError(f"{self.base_url}/v1/models answered {reply.status_code}")
        return [str(m["id"]) for m in reply.json().get("data", [])]

    async def check_model(self, model: str) -> None:
        served = await self.models()
        if model not in served:
            raise UserError(
                f"model {model!r} is not served at {self.base_url}; it serves: {', '.join(served)}"
            )

    async def metrics_text(self) -> str | None:
        reply = await self._get("/metrics")
        return reply.text if reply.status_code == 200 else None

    async def counters(self) -> exposition.SeriesSample | None:
        """Speculative counters summed over every series for the model; None if absent."""
        text = await self.metrics_text()
        if text is None:
            return None
        parsed = exposition.parse(text)
        samples = [s for s in parsed.series.values() if s.has_spec_decode]
        if not samples:
            return None
        total = exposition.SeriesSample(has_spec_decode=True)
        for s in samples:
            total.drafts += s.drafts
            total.draft_tokens += s.draft_tokens
            total.accepted += s.accepted
            total.generation_tokens += s.generation_tokens
            for i, v in s.accepted_per_pos.items():
                total.accepted_per_pos[i] = total.accepted_per_pos.get(i, 0.0) + v
        return total

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

    async def chat(self, model: str, prompt: str, max_tokens: int) -> tuple[list[int], int, float]:
        """(completion token ids, completion tokens, latency seconds) for one greedy request."""
        body = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        started = time.perf_counter()
        try:
            reply = await self.client.post("/v1/chat/completions", json=body)
        except httpx.ConnectError as err:
            raise UserError(f"cannot reach {self.base_url}: {err}") from None
        latency = time.perf_counter() - started
        if reply.status_code != 200:
            raise UserError(
                f"{self.base_url}/v1/chat/completions answered {reply.status_code}: "
                f"{reply.text[:300]}"
            )
        data = reply.json()
        token_ids = [int(t) for t in data["choices"][0].get("token_ids") or []]
        return token_ids, int(data["usage"]["completion_tokens"]), latency
