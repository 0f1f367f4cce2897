"""An OpenAI-compatible server that answers instantly, for measuring benchmark clients.

    python -m dflash_ops.bench.fake_server --port 8123

Chat completions stream one SSE chunk per token (as vLLM does without speculation) with a final
usage chunk, or answer at once when not streamed; `/v1/models`, `/health` and a small vLLM-style
`/metrics` (speculative counters that grow with the tokens served) complete the surface. With no
model to run, a client's throughput against it is the client's own ceiling.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from aiohttp import web

MODEL = "fake"


class Counters:
    def __init__(self, model: str = MODEL) -> None:
        self.requests = 0
        self.tokens = 0
        self.model = model

    def page(self) -> str:
        drafts = self.tokens // 4
        labels = f'engine="0",model_name="{self.model}"'
        per_pos = [int(drafts * p) for p in (0.8, 0.6, 0.4)]
        lines = [
            f"vllm:num_requests_running{{{labels}}} 0.0",
            f'vllm:request_success_total{{{labels},finished_reason="length"}} '
            f"{float(self.requests)}",
            f"vllm:generation_tokens_total{{{labels}}} {float(self.tokens)}",
            f"vllm:spec_decode_num_drafts_total{{{labels}}} {float(drafts)}",
            f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {float(drafts * 3)}",
            f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {float(sum(per_pos))}",
            *(
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{i}"}} '
                f"{float(v)}"
                for i, v in enumerate(per_pos)
            ),
        ]
        return "\n".join(lines) + "\n"


def _max_tokens(body: dict[str, Any]) -> int:
    return int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)


def make_app(speculative: bool = True, model: str = MODEL) -> web.Application:
    """The instant server; `speculative=False` exports no spec_decode counters (a reference)."""
    counters = Counters(model)

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": model, "object": "model"}]})

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    async def metrics(request: web.Request) -> web.Response:
        page = counters.page()
        if not speculative:
            page = "".join(line for line in page.splitlines(True) if "spec_decode" not in line)
        return web.Response(text=page)

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        tokens = _max_tokens(body)
        counters.requests += 1
        counters.tokens += tokens
        created = int(time.time())
        usage = {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": tokens + 8}
        if not body.get("stream"):
            return web.json_response(
                {
                    "id": f"chatcmpl-{counters.requests}",
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "tok " * tokens},
                            "finish_reason": "length",
                            "token_ids": list(range(tokens)),
                        }
                    ],
                    "usage": usage,
                }
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        head = (
            f'data: {{"id":"chatcmpl-{counters.requests}","object":"chat.completion.chunk",'
            f'"created":{created},"model":"{model}","choices":[{{"index":0,"delta":'
        ).encode()
        chunk = head + b'{"content":"tok "},"finish_reason":null}]}\n\n'
        batch = 16
        for start in range(0, tokens, batch):
            await response.write(chunk * min(batch, tokens - start))
        tail = {
            "id": f"chatcmpl-{counters.requests}",
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": usage,
        }
        await response.write(f"data: {json.dumps(tail)}\n\ndata: [DONE]\n\n".encode())
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/chat/completions", chat)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--served-model-name", default=MODEL)
    args = parser.parse_args(argv)
    app = make_app(model=args.served_model_name)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
