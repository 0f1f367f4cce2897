"""The `helm test` checks against fake OpenAI servers: a chat, a tool call, and speculative
counters read from every pod while the Service routes requests to just one of them."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from dflash_ops.deployment_checks import helm_test

from tests.service.fake_engine import Counters, vllm_page


class FakePod:
    """One engine pod: answers chats (moving its draft counter) and /metrics."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.counters = Counters()
        self.answer = answer
        pod = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._send(200, vllm_page(pod.counters).encode(), "text/plain")

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                pod.counters.step(5, [4, 3, 2, 1])
                self._send(200, json.dumps(pod.answer).encode(), "application/json")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def chat_answer(content: str) -> dict[str, Any]:
    return {"choices": [{"message": {"content": content}, "finish_reason": "stop"}]}


@pytest.fixture()
def pods() -> Iterator[list[FakePod]]:
    made = [FakePod(chat_answer("2 + 2 = 4")), FakePod(chat_answer("2 + 2 = 4"))]
    yield made
    for pod in made:
        pod.close()


def test_spec_metrics_sees_the_pod_that_served_even_when_the_service_reads_another(
    pods: list[FakePod],
) -> None:
    # The Service sends the chat to pod 1; a /metrics read through it could land on pod 0.
    with httpx.Client(base_url=pods[1].url, timeout=10) as client:
        message = helm_test.spec_metrics(client, "m", [p.url for p in pods])
    assert message.startswith("speculative counters moving over 2 pod(s): drafts 0 -> 5")
    with (
        httpx.Client(base_url=pods[1].url, timeout=10) as client,
        pytest.raises(helm_test.CheckFailed, match="did not move on any of 1 pods"),
    ):
        helm_test.spec_metrics(client, "m", [pods[0].url], settle_s=0.5)


def test_chat_and_tool_call_checks_fail_on_wrong_answers() -> None:
    wrong = FakePod(chat_answer("five"))
    tool = FakePod(
        {
            "choices": [
                {
                    "finish_reason": "tool_calls",
                    "message": {
                        "tool_calls": [
                            {"function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
                        ]
                    },
                }
            ]
        }
    )
    try:
        with httpx.Client(base_url=wrong.url, timeout=10) as client:
            with pytest.raises(helm_test.CheckFailed, match="expected 4"):
                helm_test.chat(client, "m")
            with pytest.raises(helm_test.CheckFailed, match="finish_reason is 'stop'"):
                helm_test.tool_call(client, "m")
        with httpx.Client(base_url=tool.url, timeout=10) as client:
            assert "get_weather({'city': 'Paris'})" in helm_test.tool_call(client, "m")
    finally:
        wrong.close()
        tool.close()


def test_pods_are_found_through_dns() -> None:
    assert "http://127.0.0.1:8000" in helm_test.pod_addresses("localhost", 8000)
    with pytest.raises(helm_test.CheckFailed, match="cannot resolve the serving pods"):
        helm_test.pod_addresses("no-such-service.invalid", 8000)


def test_main_reports_a_failure_as_exit_1(pods: list[FakePod]) -> None:
    pods[0].answer = chat_answer("no idea")
    assert helm_test.main(["chat", "--base-url", pods[0].url, "--model", "m"]) == 1
    assert helm_test.main(["chat", "--base-url", pods[1].url, "--model", "m"]) == 0
