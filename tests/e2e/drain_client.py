"""The drain test's client (tests/e2e/test_engine_auth_and_drain.py), run as a process in a
session of its own: it streams one completion from the engine and SIGTERMs the engine's API
server at the first chunk, when the request is in the engine core, as the kubelet would;
then reads the stream to its end, counting it cut after `--cut-after-s` without a chunk.
Prints {"finish": ..., "tokens": ..., "after_s": ...} as JSON: the finish reason, the completion
tokens received and how long the stream ran after the signal.

Why a process of its own: the kernel shares the CPU between sessions first (autogroups), and
while the engine generated, a process in the test's session (with stress-ng beside it) slept
16 s instead of 20 ms; a SIGTERM sent from there found all 8,000 tokens generated. In a session
of its own the same sleep overslept by at most 2.5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

import httpx


def stream_through_sigterm(
    url: str, pid: int, model: str, max_tokens: int, cut_after_s: float
) -> dict[str, object]:
    payload = {
        "model": model,
        "prompt": "Count on:",
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    finish, tokens, signalled_at = None, 0, None
    try:
        # A draining engine streams a chunk per step, so a long quiet means the stream was cut:
        # vLLM's default (abort) leaves the connection open without sending anything.
        with httpx.stream(
            "POST",
            url + "/v1/completions",
            json=payload,
            timeout=httpx.Timeout(300, read=cut_after_s),
        ) as reply:
            reply.raise_for_status()
            for line in reply.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                for choice in event.get("choices", []):
                    finish = choice.get("finish_reason") or finish
                    if signalled_at is None:
                        os.kill(pid, signal.SIGTERM)
                        signalled_at = time.monotonic()
                if event.get("usage"):
                    tokens = int(event["usage"]["completion_tokens"])
    except httpx.TransportError:
        pass  # the connection was cut
    if signalled_at is None:
        raise SystemExit("the stream ended before its first chunk: no SIGTERM was sent")
    return {"finish": finish, "tokens": tokens, "after_s": time.monotonic() - signalled_at}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("pid", type=int, help="the engine's API server")
    parser.add_argument("--model", required=True)
    parser.add_argument("--max-tokens", type=int, required=True)
    parser.add_argument("--cut-after-s", type=float, required=True)
    args = parser.parse_args(argv)
    result = stream_through_sigterm(
        args.url, args.pid, args.model, args.max_tokens, args.cut_after_s
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
