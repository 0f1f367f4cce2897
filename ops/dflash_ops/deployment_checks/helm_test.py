"""The checks `helm test` runs against a release (in the sidecar image).

    python -m dflash_ops.deployment_checks.helm_test chat --base-url http://svc:8000 --model NAME
    python -m dflash_ops.deployment_checks.helm_test tool-call --base-url ... --model NAME
    python -m dflash_ops.deployment_checks.helm_test spec-metrics --base-url ... --model NAME \\
        --pods-dns RELEASE-pods.NAMESPACE.svc --pods-port 8000
    python -m dflash_ops.deployment_checks.helm_test wait-ready --base-url ... --model NAME \\
        --budget-seconds 4500

Each prints what it checked and exits 1 with the reason when the answer is wrong. With
VLLM_API_KEY set (the release's auth.apiKeySecret) every request carries it as a bearer token.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

import httpx
from dflash_sidecar import metrics_parser

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


def pod_addresses(dns_name: str, port: int) -> list[str]:
    """Base URLs of every serving pod behind a headless Service."""
    try:
        infos = socket.getaddrinfo(dns_name, port, proto=socket.IPPROTO_TCP)
    except socket.gaierror as err:
        raise CheckFailed(f"cannot resolve the serving pods at {dns_name}: {err}") from None
    hosts = sorted({str(info[4][0]) for info in infos})
    return [f"http://[{h}]:{port}" if ":" in h else f"http://{h}:{port}" for h in hosts]


def total_drafts(client: httpx.Client, pods: list[str]) -> float:
    """vllm:spec_decode_num_drafts_total summed over every serving pod."""
    total = 0.0
    for base in pods:
        reply = client.get(f"{base}/metrics")
        if reply.status_code != 200:
            raise CheckFailed(f"{base}/metrics answered {reply.status_code}")
        samples = [s for s in metrics_parser.parse(reply.text).series.values() if s.has_spec_decode]
        if not samples:
            raise CheckFailed(f"{base} exports no vllm:spec_decode_* counters")
        total += sum(s.drafts for s in samples)
    return total


def spec_metrics(client: httpx.Client, model: str, pods: list[str], settle_s: float = 10.0) -> str:
    """A chat through the Service moves the draft counter of whichever pod served it: read the
    counters of every pod (not through the Service, which may route each read elsewhere)."""
    before = total_drafts(client, pods)
    chat(client, model)
    deadline = time.monotonic() + settle_s  # the engine publishes its counters each step
    after = total_drafts(client, pods)
    while after <= before and time.monotonic() < deadline:
        time.sleep(1)
        after = total_drafts(client, pods)
    if after <= before:
        raise CheckFailed(
            f"vllm:spec_decode_num_drafts_total did not move on any of {len(pods)} pods "
            f"({before:.0f} -> {after:.0f})"
        )
    return (
        f"speculative counters moving over {len(pods)} pod(s): drafts {before:.0f} -> {after:.0f}"
    )


def wait_ready(client: httpx.Client, model: str, budget_s: float, interval_s: float = 10.0) -> str:
    """Until the release serves the model (/v1/models lists it), for at most budget_s: the wait
    target of `helm install --wait` in the Ray layout, whose RayCluster Helm sees as ready at
    once."""
    start = time.monotonic()
    last = "no answer yet"
    while True:
        try:
            reply = client.get("/v1/models")
            if reply.status_code == 200:
                served = [m.get("id") for m in reply.json().get("data", [])]
                if model in served:
                    return f"serving {model} after {time.monotonic() - start:.0f} s"
                last = f"/v1/models lists {served}, not {model}"
            else:
                last = f"/v1/models answered {reply.status_code}: {reply.text[:200]}"
        except (httpx.HTTPError, ValueError, AttributeError) as err:
            last = f"{type(err).__name__}: {err}"
        if time.monotonic() - start + interval_s > budget_s:
            raise CheckFailed(f"not serving {model} after {budget_s:.0f} s; last: {last}")
        time.sleep(interval_s)


CHECKS = ("chat", "tool-call", "spec-metrics", "wait-ready")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("check", choices=CHECKS)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument(
        "--pods-dns", help="spec-metrics: headless Service name that resolves to every pod"
    )
    parser.add_argument("--pods-port", type=int, default=8000)
    parser.add_argument(
        "--budget-seconds", type=float, default=3600.0, help="wait-ready: how long to wait"
    )
    parser.add_argument("--interval-seconds", type=float, default=10.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # The release's API key (chart: auth.apiKeySecret), for the routes vLLM guards.
    key = os.environ.get("VLLM_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(base_url=args.base_url, timeout=args.timeout, headers=headers) as client:
        try:
            if args.check == "chat":
                print(chat(client, args.model))
            elif args.check == "tool-call":
                print(tool_call(client, args.model))
            elif args.check == "wait-ready":
                print(wait_ready(client, args.model, args.budget_seconds, args.interval_seconds))
            else:
                pods = (
                    pod_addresses(args.pods_dns, args.pods_port)
                    if args.pods_dns
                    else [args.base_url.rstrip("/")]
                )
                print(spec_metrics(client, args.model, pods))
        except (CheckFailed, httpx.HTTPError) as err:
            print(f"FAIL {args.check}: {err}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
