"""A misbehaving OpenAI server for the benchmark's error paths, addressed by path prefix:

/garbage/...    /v1/models answers HTML; chat answers 500
/no-ids/...     greedy chats answer without token ids
/speculating/.. a reference that drafts tokens (its /metrics counters move)
/slow/...       streams one chunk every 50 ms
/good/...       the instant server without speculative counters (a lossless reference)
/other/...      like /good, other tokens
/hang/...       chat requests (and /metrics) are accepted and never answered
/no-usage/...   streams content and never a usage chunk
/restarting/... speculative counters that start again from zero at the 6th chat request (an
                engine restart); they count requests served since the (re)start: 10 drafts,
                30 draft tokens, 15 accepted each
/queue/...      each request takes 200 ms per request in flight when it arrives (a server whose
                latency grows with load)
/batch/...      each request is held 1.5 s; /metrics reports the requests in flight as
                vllm:num_requests_running (an engine's running batch)
/off-slow/T/... instant, but 50 ms a token while the last upgrade POSTed to /off-slow/T/deployed
                (the sweep tests' stand-in helm) set speculative.method=off: speculation always
                wins; no /metrics (no running batch)

/echo/T/...     instant; GET /echo/T/bodies lists the chat (and completions) request bodies it
                received
/hostile/K/...  20 content chunks, then what a broken or lying server sends, by K: choices-object
                ("choices" an object), usage-infinity, usage-negative, usage-billion (10^9
                completion tokens), usage-over-max (5,000); and text-held-back (usage 321, an
                honest stream whose tokens mostly carried no text of their own)
/steps/...      streams max_tokens tokens: the first alone, then N per chunk where the prompt
                says `[steps=N]` (1 otherwise), as a speculating engine streams one chunk a step
/markov/V/...   sampled token ids (non-streamed, `return_token_ids`) from a fixed Markov chain over
                12 tokens at the request's temperature, repeatable by its `seed`. V `exact`
                samples it exactly; V `sharp` is a broken speculative sampler: from the second
                token on, 30% of the tokens are the chain's most likely one instead of a sample

`--die-after N`: the process exits (as a crashed server) when its Nth chat request arrives.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import zlib
from typing import Any

from aiohttp import web
from dflash_ops.bench.fake_server import make_app


async def stream_tokens(
    request: web.Request, tokens: int, usage: bool = True
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b'data: {"choices":[{"delta":{"content":"tok "}}]}\n\n' * tokens)
    if usage:
        tail = {"usage": {"completion_tokens": tokens, "prompt_tokens": 3}}
        await response.write(f"data: {json.dumps(tail)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    return response


def scripted() -> web.Application:
    app = web.Application()
    drafts = {"count": 0}
    restarting = {"served": 0, "since_start": 0}
    queue = {"in_flight": 0}
    batch = {"in_flight": 0}

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

    async def markov_chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("stream"):  # the benchmark's own requests
            return await stream_tokens(request, int(body["max_tokens"]))
        tokens = markov_tokens(
            body["messages"][-1]["content"],
            int(body["max_tokens"]),
            float(body.get("temperature", 1.0)),
            int(body.get("seed", 0)),
            sharp=request.match_info["variant"] == "sharp",
        )
        return web.json_response({"choices": [{"message": {"content": "x"}, "token_ids": tokens}]})

    app.router.add_get("/markov/{variant}/v1/models", models)
    app.router.add_post("/markov/{variant}/v1/chat/completions", markov_chat)

    async def hang_chat(request: web.Request) -> web.Response:
        await asyncio.sleep(3600)
        return web.Response(status=500)

    app.router.add_get("/hang/metrics", hang_chat)  # a replica whose /metrics never answers

    async def no_usage_chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        return await stream_tokens(request, int(body.get("max_tokens", 4)), usage=False)

    async def restarting_chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        restarting["served"] += 1
        if restarting["served"] == 6:
            restarting["since_start"] = 0
        restarting["since_start"] += 1
        return await stream_tokens(request, int(body.get("max_tokens", 4)))

    async def restarting_metrics(request: web.Request) -> web.Response:
        n = float(restarting["since_start"])
        labels = 'engine="0",model_name="fake"'
        return web.Response(
            text=f"vllm:generation_tokens_total{{{labels}}} {n * 40}\n"
            f"vllm:spec_decode_num_drafts_total{{{labels}}} {n * 10}\n"
            f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {n * 30}\n"
            f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {n * 15}\n"
        )

    async def queue_chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        queue["in_flight"] += 1
        try:
            await asyncio.sleep(0.2 * queue["in_flight"])
            return await stream_tokens(request, int(body.get("max_tokens", 4)))
        finally:
            queue["in_flight"] -= 1

    async def batch_chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        batch["in_flight"] += 1
        try:
            await asyncio.sleep(1.5)
            return await stream_tokens(request, int(body.get("max_tokens", 4)))
        finally:
            batch["in_flight"] -= 1

    async def batch_metrics(request: web.Request) -> web.Response:
        labels = 'engine="0",model_name="fake"'
        return web.Response(text=f"vllm:num_requests_running{{{labels}}} {batch['in_flight']}\n")

    for prefix, chat in (
        ("/hang", hang_chat),
        ("/no-usage", no_usage_chat),
        ("/restarting", restarting_chat),
        ("/queue", queue_chat),
        ("/batch", batch_chat),
    ):
        app.router.add_get(f"{prefix}/v1/models", models)
        app.router.add_get(f"{prefix}/health", health)
        app.router.add_post(f"{prefix}/v1/chat/completions", chat)
    app.router.add_get("/restarting/metrics", restarting_metrics)
    app.router.add_get("/batch/metrics", batch_metrics)

    deployed: dict[str, list[str]] = {}

    async def record_upgrade(request: web.Request) -> web.Response:
        deployed[request.match_info["token"]] = await request.json()
        return web.Response(text="")

    async def off_slow_chat(request: web.Request) -> web.StreamResponse:
        if "speculative.method=off" in deployed.get(request.match_info["token"], []):
            return await slow_chat(request)
        body = await request.json()
        return await stream_tokens(request, int(body.get("max_tokens", 4)))

    app.router.add_post("/off-slow/{token}/deployed", record_upgrade)
    app.router.add_get("/off-slow/{token}/v1/models", models)
    app.router.add_post("/off-slow/{token}/v1/chat/completions", off_slow_chat)

    bodies: dict[str, list[dict[str, Any]]] = {}

    async def echo_chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        bodies.setdefault(request.match_info["token"], []).append(body)
        return await stream_tokens(request, int(body.get("max_tokens", 4)))

    async def echo_bodies(request: web.Request) -> web.Response:
        return web.json_response(bodies.get(request.match_info["token"], []))

    async def steps_chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        text = json.dumps(body.get("messages", []))
        found = text.split("[steps=", 1)[1].split("]", 1)[0] if "[steps=" in text else "1"
        per_step, tokens = int(found), int(body.get("max_tokens", 4))
        sizes = [1] + [per_step] * ((tokens - 1) // per_step)
        if sum(sizes) < tokens:
            sizes.append(tokens - sum(sizes))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for size in sizes:
            chunk = {"choices": [{"delta": {"content": "tok " * size}}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        tail = {"usage": {"completion_tokens": tokens, "prompt_tokens": 3}}
        await response.write(f"data: {json.dumps(tail)}\n\ndata: [DONE]\n\n".encode())
        return response

    async def hostile_chat(request: web.Request) -> web.StreamResponse:
        kind = request.match_info["kind"]
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices":[{"delta":{"content":"tok "}}]}\n\n' * 20)
        tails = {
            "choices-object": b'data: {"choices": {"0": {"delta": {"content": "x"}}}}',
            "usage-infinity": b'data: {"usage": {"completion_tokens": Infinity}}',
            "usage-negative": b'data: {"usage": {"completion_tokens": -5}}',
            "usage-billion": b'data: {"usage": {"completion_tokens": 1000000000}}',
            "usage-over-max": b'data: {"usage": {"completion_tokens": 5000}}',
            "text-held-back": b'data: {"usage": {"completion_tokens": 321}}',
        }
        await response.write(tails[kind] + b"\n\ndata: [DONE]\n\n")
        return response

    app.router.add_get("/hostile/{kind}/v1/models", models)
    app.router.add_post("/hostile/{kind}/v1/chat/completions", hostile_chat)
    app.router.add_get("/steps/v1/models", models)
    app.router.add_post("/steps/v1/chat/completions", steps_chat)

    async def echo_completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        bodies.setdefault(request.match_info["token"], []).append(body)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        tokens = int(body.get("max_tokens", 4))
        await response.write(b'data: {"choices":[{"text":"tok "}]}\n\n' * tokens)
        tail = {"choices": [], "usage": {"completion_tokens": tokens, "prompt_tokens": 3}}
        await response.write(f"data: {json.dumps(tail)}\n\ndata: [DONE]\n\n".encode())
        return response

    app.router.add_post("/echo/{token}/v1/completions", echo_completions)
    app.router.add_get("/echo/{token}/v1/models", models)
    app.router.add_post("/echo/{token}/v1/chat/completions", echo_chat)
    app.router.add_get("/echo/{token}/bodies", echo_bodies)
    return app


MARKOV_VOCAB = 12


def markov_tokens(prompt: str, count: int, temperature: float, seed: int, sharp: bool) -> list[int]:
    """`count` tokens of the test chain: next-token logits depend on the previous token."""
    chain = random.Random(7)
    logits = [[chain.gauss(0, 2) for _ in range(MARKOV_VOCAB)] for _ in range(MARKOV_VOCAB)]
    draw = random.Random(seed)
    previous = zlib.crc32(prompt.encode()) % MARKOV_VOCAB
    tokens = []
    for position in range(count):
        row = [value / max(temperature, 1e-6) for value in logits[previous]]
        top = max(row)
        weights = [math.exp(value - top) for value in row]
        if sharp and position > 0 and draw.random() < 0.3:
            token = row.index(top)
        else:
            token = draw.choices(range(MARKOV_VOCAB), weights)[0]
        tokens.append(token)
        previous = token
    return tokens


def dying(after: int) -> web.Application:
    """The instant server, which exits when its `after`-th chat request arrives."""
    app = make_app()
    chats = {"count": 0}

    @web.middleware
    async def crash(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path == "/v1/chat/completions":
            chats["count"] += 1
            if chats["count"] >= after:
                os._exit(1)
        response: web.StreamResponse = await handler(request)
        return response

    app.middlewares.append(crash)
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--die-after", type=int)
    args = parser.parse_args()
    app = dying(args.die_after) if args.die_after else scripted()
    web.run_app(
        app, host="127.0.0.1", port=args.port, print=None, access_log=None, shutdown_timeout=1
    )


if __name__ == "__main__":
    main()
