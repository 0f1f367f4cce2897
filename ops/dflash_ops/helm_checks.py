"""The checks `helm test` runs against a release (in the sidecar image).

    python -m dflash_ops.helm_checks chat --base-url http://svc:8000 --model NAME
    python -m dflash_ops.helm_checks tool-call --base-url ... --model NAME
    python -m dflash_ops.helm_checks spec-metrics --base-url ... --model NAME

Each prints what it checked and exits 1 with the reason when the answer is wrong.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import httpx
from dflash_sidecar import exposition

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
        },
    },
}


class CheckFailed(Exception):
    pass


def chat(client: httpx.Client, model: str) -> str:
    reply = client.post(
        "/v1/chat/completions",
        json={
            "model": model,
            "messages": [{"role": "user", "content": "What is 2 + 2? Answer with the number."}],
            "max_tokens": 256,
            "temperature": 0,
        },
    )
    if reply.status_code != 200:
        raise CheckFailed(f"chat completion answered {reply.status_code}: {reply.text[:300]}")
    message = reply.json()["choices"][0]["message"]
    content = message.get("content") or ""
    if "4" not in content:
        raise CheckFailed(f"expected 4 in the answer, got {content[:200]!r}")
    return f"chat ok: {content.strip()[:80]!r}"


def tool_call(client: httpx.Client, model: str) -> str:
    reply = client.post(
        "/v1/chat/completions",
        json={
            "model": model,
            "messages": [{"role": "user", "content": "What is the weather in Paris right now?"}],
            "tools": [WEATHER_TOOL],
            "tool_choice": "auto",
            "max_tokens": 512,
            "temperature": 0,
        },
    )
    if reply.status_code != 200:
        raise CheckFailed(f"tool-call completion answered {reply.status_code}: {reply.text[:300]}")
    choice = reply.json()["choices"][0]
    if choice.get("finish_reason") != "tool_calls":
        raise CheckFailed(f"finish_reason is {choice.get('finish_reason')!r}, not 'tool_calls'")
    calls = choice["message"].get("tool_calls") or []
    if not calls or calls[0]["function"]["name"] != "get_weather":
        raise CheckFailed(f"expected a get_weather call, got {calls!r}")
    try:
        arguments = json.loads(calls[0]["function"]["arguments"])
    except json.JSONDecodeError as err:
        raise CheckFailed(f"tool arguments are not valid JSON: {err}") from None
    if not isinstance(arguments, dict) or "city" not in arguments:
        raise CheckFailed(f"tool arguments lack 'city': {arguments!r}")
    return f"tool call ok: get_weather({arguments})"


def spec_metrics(client: httpx.Client, model: str) -> str:
    def drafts() -> float:
        reply = client.get("/metrics")
        if reply.status_code != 200:
            raise CheckFailed(f"/metrics answered {reply.status_code}")
        samples = [s for s in exposition.parse(reply.text).series.values() if s.has_spec_decode]
        if not samples:
            raise CheckFailed("the engine exports no vllm:spec_decode_* counters")
        return sum(s.drafts for s in samples)

    before = drafts()
    chat(client, model)
    time.sleep(1)
    after = drafts()
    if after <= before:
        raise CheckFailed(f"vllm:spec_decode_num_drafts_total did not move ({before} -> {after})")
    return f"speculative counters moving: drafts {before:.0f} -> {after:.0f}"


CHECKS = {"chat": chat, "tool-call": tool_call, "spec-metrics": spec_metrics}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("check", choices=sorted(CHECKS))
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    with httpx.Client(base_url=args.base_url, timeout=args.timeout) as client:
        try:
            print(CHECKS[args.check](client, args.model))
        except (CheckFailed, httpx.HTTPError) as err:
            print(f"FAIL {args.check}: {err}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
