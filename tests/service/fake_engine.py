"""An in-process stand-in for vLLM's HTTP surface, for unit tests of the monitor (httpx mock)."""

from __future__ import annotations

import httpx


class FakeEngine:
    def __init__(self, metrics: str) -> None:
        self.metrics = metrics
        self.health_status = 200
        self.completion_status = 200
        self.reachable = True
        self.completions = 0

    def handler(self, request: httpx.Request) -> httpx.Response:
        if not self.reachable:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/health":
            return httpx.Response(self.health_status)
        if request.url.path == "/metrics":
            return httpx.Response(200, text=self.metrics)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}]})
        if request.url.path == "/v1/completions":
            self.completions += 1
            if self.completion_status != 200:
                return httpx.Response(self.completion_status, text="EngineCore died")
            return httpx.Response(200, json={"choices": [{"text": "!"}]})
        return httpx.Response(404)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url="http://engine", transport=httpx.MockTransport(self.handler), timeout=1.0
        )
