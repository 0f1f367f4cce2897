"""A misbehaving OpenAI server for the benchmark's error paths, addressed by path prefix:

/garbage/...    /v1/models answers HTML; chat answers 500
/no-ids/...     greedy chats answer without token ids
/speculating/.. a reference that drafts tokens (its /metrics counters move)
/slow/...       streams one chunk every 50 ms
/good/...       the instant server without speculative counters (a lossless reference)
/other/...      like /good, other tokens
"""

from __future__ import annotations

import argparse
import asyncio
import json

from aiohttp import web
from dflash_ops.bench.fake_server import make_app


def scripted() -> web.Application:
    app = web.Application()
    drafts = {"count": 0}

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    async def garbage_models(request: web.Request) -> web.Response:
        return web.Response(text="<html>502 Bad Gateway</html>", content_type="text/html")

    async def garbage_chat(request: web.Request) -> web.Response:
        return web.Response(status=500, text="EngineCore died")

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "fake"}]})

    async def no_ids(request: web.Request) -> web.Response:
        return web.json_response({"choices": [{"message": {"content": "x"}}]})

    async def speculating_chat(request: web.Request) -> web.Response:
        drafts["count"] += 5
        return web.json_response({"choices": [{"message": {"content": "x"}, "token_ids": [1, 2]}]})

    async def speculating_metrics(request: web.Request) -> web.Response:
        n = float(drafts["count"])
        labels = 'engine="0",model_name="fake"'
        return web.Response(
            text=f"vllm:generation_tokens_total{{{labels}}} {n}\n"
            f"vllm:spec_decode_num_drafts_total{{{labels}}} {n}\n"
            f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {n * 3}\n"
            f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {n}\n"
        )

    async def slow_chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(int(body.get("max_tokens", 4))):
            await asyncio.sleep(0.05)
            await response.write(b'data: {"choices":[{"delta":{"content":"t"}}]}\n\n')
        usage = {"usage": {"completion_tokens": int(body.get("max_tokens", 4)), "prompt_tokens": 3}}
        await response.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        return response

    app.router.add_get("/health", health)
    app.router.add_get("/garbage/v1/models", garbage_models)
    app.router.add_post("/garbage/v1/chat/completions", garbage_chat)
    for prefix in ("/no-ids", "/speculating", "/slow"):
        app.router.add_get(f"{prefix}/v1/models", models)
    app.router.add_post("/no-ids/v1/chat/completions", no_ids)
    app.router.add_post("/speculating/v1/chat/completions", speculating_chat)
    app.router.add_get("/speculating/metrics", speculating_metrics)
    app.router.add_post("/slow/v1/chat/completions", slow_chat)

    async def other_chat(request: web.Request) -> web.Response:
        return web.json_response({"choices": [{"message": {"content": "x"}, "token_ids": [7, 7]}]})

    app.router.add_get("/other/v1/models", models)
    app.router.add_post("/other/v1/chat/completions", other_chat)
    app.add_subapp("/good", make_app(speculative=False))
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    web.run_app(scripted(), host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
