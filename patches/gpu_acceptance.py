#!/usr/bin/env python3
"""GPU acceptance for the patch series: run on a 2x A100-80GB (or H100) machine.

Inside the patched image (or any environment with vllm==0.33.0 and the series applied):

    python patches/gpu_acceptance.py \
        --model <Qwen3.8-Flash-Next checkpoint> --draft <DFlash2 draft> [--min-acceptance 3.0]

It checks, in order, and exits non-zero at the first failure:
1. the series is applied to the importable vLLM (`dflash-serve patches check --require-applied`);
2. the engine starts with the DFlash2 draft at block 8 (k=7), TP2, expert parallel,
   `--mamba-cache-mode align` and the planner's block size, and its log names the aux layers
   (6, 16, 26, 36, 46);
3. ten fixed prompts, greedy, complete;
4. the mean acceptance length from `/metrics` deltas (1 + accepted / drafts) reaches
   --min-acceptance (measured elsewhere: 4.08 at block 8), and position 0 accepts most drafts.
Progress goes to stderr; a JSON summary is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

EXPECTED_AUX_LAYERS = "(6, 16, 26, 36, 46)"
PROMPTS = [
    "Prove that the square root of 2 is irrational.",
    "Write a Python function that merges two sorted lists.",
    "Explain how a hash map handles collisions.",
    "What is 17 * 23? Show your steps.",
    "Summarize the causes of the French Revolution in five sentences.",
    "Write a SQL query returning the ten most recent orders per customer.",
    "Describe the difference between TCP and UDP.",
    "Solve for x: 3x + 7 = 22.",
    "Write a haiku about autumn rain.",
    "Explain gradient descent to a new engineer.",
]
COUNTER = re.compile(r"^(vllm:spec_decode_num_\w+?)(?:_total)?(\{[^}]*\})?\s+([0-9.eE+-]+)$")


def log(message: str) -> None:
    print(f"[gpu-acceptance] {message}", file=sys.stderr, flush=True)


def spec_counters(base_url: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"{base_url}/metrics", timeout=10).read().decode()
    totals: dict[str, float] = {}
    for line in text.splitlines():
        match = COUNTER.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        position = re.search(r'position="(\d+)"', labels or "")
        key = f"{name}[{position.group(1)}]" if position else name
        totals[key] = totals.get(key, 0.0) + float(value)
    return totals


def complete(base_url: str, model: str, prompt: str) -> str:
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 256,
            "temperature": 0,
        }
    ).encode()
    request = urllib.request.Request(
        f"{base_url}/v1/chat/completions", body, {"Content-Type": "application/json"}
    )
    reply = json.load(urllib.request.urlopen(request, timeout=600))
    return str(reply["choices"][0]["message"]["content"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--gpu", default="a100", choices=["a100", "h100"])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--min-acceptance", type=float, default=3.0)
    parser.add_argument("--startup-timeout", type=int, default=3600)
    parser.add_argument("--log", type=Path, default=Path("gpu-acceptance-engine.log"))
    args = parser.parse_args()

    log("1/4 checking the patch series")
    subprocess.run(["dflash-serve", "patches", "check", "--require-applied"], check=True)
    plan = json.loads(
        subprocess.run(
            [
                "dflash-serve",
                "plan",
                "--gpu",
                args.gpu,
                "--tp",
                "2",
                "--k",
                "7",
                "--draft-model",
                args.draft,
                "--format",
                "json",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    engine_args = plan["vllm_args"]["7"]
    log(f"2/4 starting vLLM: {' '.join(engine_args)} (log: {args.log})")
    env = os.environ | {"VLLM_PLE_CPU_OFFLOAD": "1"}
    with args.log.open("w") as engine_log:
        engine = subprocess.Popen(
            ["vllm", "serve", args.model, "--port", str(args.port), *engine_args],
            stdout=engine_log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    base_url = f"http://127.0.0.1:{args.port}"
    try:
        deadline = time.monotonic() + args.startup_timeout
        while True:
            if engine.poll() is not None:
                log(f"engine exited with {engine.returncode}; see {args.log}")
                return 1
            try:
                if urllib.request.urlopen(f"{base_url}/health", timeout=5).status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                log("engine did not become healthy in time")
                return 1
            time.sleep(10)
        startup_log = args.log.read_text()
        if EXPECTED_AUX_LAYERS not in startup_log:
            log(f"the engine log does not name the aux layers {EXPECTED_AUX_LAYERS}")
            return 1
        log(f"aux layers {EXPECTED_AUX_LAYERS} are set")

        log("3/4 running the fixed prompts")
        complete(base_url, args.model, "warm up")
        before = spec_counters(base_url)
        for i, prompt in enumerate(PROMPTS, 1):
            complete(base_url, args.model, prompt)
            log(f"   prompt {i}/{len(PROMPTS)} done")
        after = spec_counters(base_url)
    finally:
        engine.terminate()
        engine.wait(timeout=120)

    log("4/4 acceptance from /metrics deltas")
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    drafts = delta.get("vllm:spec_decode_num_drafts", 0.0)
    accepted = delta.get("vllm:spec_decode_num_accepted_tokens", 0.0)
    if drafts <= 0:
        log("no drafts were counted: speculative decoding did not run")
        return 1
    per_position = [
        delta[f"vllm:spec_decode_num_accepted_tokens_per_pos[{i}]"] / drafts
        for i in range(7)
        if f"vllm:spec_decode_num_accepted_tokens_per_pos[{i}]" in delta
    ]
    summary = {
        "mean_acceptance_length": 1 + accepted / drafts,
        "per_position_acceptance": per_position,
        "drafts": drafts,
        "block_size": plan["recommended_block_size"]["7"],
    }
    print(json.dumps(summary, indent=2))
    ok = summary["mean_acceptance_length"] >= args.min_acceptance and (
        not per_position or per_position[0] >= 0.5
    )
    log("PASS" if ok else "FAIL: acceptance is below the threshold (wrong captured features?)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
