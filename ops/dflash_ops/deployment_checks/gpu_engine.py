"""The GPU acceptance's engine and what it reads from it: one `vllm serve` process at a time
(two TP2 engines do not fit on one 2-GPU machine), the bench run against it, greedy and sampled
outputs, and the report table every step adds its rows to."""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from dflash_ops.model_profiles import PROFILES, ModelProfile


@dataclass
class Row:
    check: str
    measured: str
    expected: str
    ok: bool | None  # None: not run (dry run, or an earlier failure)


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)

    def add(self, check: str, measured: str, expected: str, ok: bool | None) -> bool:
        self.rows.append(Row(check, measured, expected, ok))
        mark = {True: "PASS", False: "FAIL", None: "-"}[ok]
        log(f"{mark} {check}: {measured} (expected {expected})")
        return bool(ok)

    def table(self) -> str:
        lines = ["| check | measured | expected | result |", "|---|---|---|---|"]
        for row in self.rows:
            result = {True: "PASS", False: "FAIL", None: "not run"}[row.ok]
            lines.append(f"| {row.check} | {row.measured} | {row.expected} | {result} |")
        return "\n".join(lines)


def log(message: str) -> None:
    print(f"[gpu-acceptance] {message}", file=sys.stderr, flush=True)


def run_json(argv: list[str], timeout: float = 600) -> Any:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)


class Engine:
    """One `vllm serve` process with its log, stopped on exit."""

    def __init__(
        self,
        args: argparse.Namespace,
        name: str,
        extra: list[str],
        profile: ModelProfile = PROFILES["qwen3.8-flash-next"],
    ) -> None:
        self.name = name
        # As the chart renders it for the model's profile.
        engram = ["--engram-config", '{"cpu_offload": true}'] if profile.engram else []
        self.argv = [
            "vllm",
            "serve",
            args.model,
            "--served-model-name",
            "model",
            "--port",
            str(args.port),
            "--tensor-parallel-size",
            str(getattr(args, "tp", 2)),
            "--enable-expert-parallel",
            "--mamba-cache-mode",
            "align",
            # As the chart: prefix-cache hits on 16-token boundaries (patch 0004 with a draft).
            "--prefix-match-unit",
            "16",
            "--reasoning-parser",
            profile.reasoning_parser,
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            profile.tool_call_parser,
            *engram,
            *extra,
        ]
        self.log_path = args.work / f"engine-{name}.log"
        self.url = f"http://127.0.0.1:{args.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_timeout = args.startup_timeout

    def __enter__(self) -> Engine:
        log(f"starting {self.name}: {shlex.join(self.argv)} (log: {self.log_path})")
        with self.log_path.open("wb") as out:
            self.process = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_timeout
        # Polls soon after the start (a warm or stand-in engine is up in a second), then every
        # 10 s while a cold engine loads.
        pause = 0.25
        while True:
            if self.process.poll() is not None:
                tail = self.log_path.read_text(errors="replace").splitlines()[-20:]
                raise RuntimeError(
                    f"{self.name} exited with {self.process.returncode}:\n  " + "\n  ".join(tail)
                )
            try:
                if urllib.request.urlopen(f"{self.url}/health", timeout=5).status == 200:
                    log(f"{self.name} ready")
                    return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not healthy after {self.startup_timeout}s")
            time.sleep(pause)
            pause = min(pause * 2, 10.0)

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def log_text(self) -> str:
        return str(self.log_path.read_text(errors="replace"))


def bench(engine: Engine, args: argparse.Namespace, name: str, *extra: str) -> Any:
    out = args.work / f"bench-{name}"
    argv = [
        sys.executable,
        "-m",
        "dflash_ops.cli",
        "bench",
        "--base-url",
        engine.url,
        "--model",
        "model",
        "--max-tokens",
        "256",
        "--repeats",
        "1",
        "--num-requests",
        "10",
        "--out",
        str(out),
        "--format",
        "json",
        # Sampled as --temperature says (0, greedy, by default: the reference measurement's,
        # which --min-acceptance is calibrated on), to --max-tokens.
        "--temperature",
        f"{args.temperature:g}",
        "--ignore-eos",
        *extra,
    ]
    return run_json(argv, timeout=args.request_timeout * 20)


def greedy_ids(engine: Engine, concurrency: int, timeout: float) -> dict[str, list[int]]:
    from dflash_ops.bench.core.client import Endpoint
    from dflash_ops.bench.core.prompts import fixed_prompts

    async def collect() -> dict[str, list[int]]:
        endpoint = Endpoint(engine.url, timeout_s=timeout)
        limit = asyncio.Semaphore(concurrency)

        async def one(prompt_id: str, text: str) -> tuple[str, list[int]]:
            async with limit:
                messages = [{"role": "user", "content": text}]
                return prompt_id, await endpoint.chat_token_ids("model", messages, 256)

        try:
            return dict(await asyncio.gather(*(one(i, t) for i, t in fixed_prompts())))
        finally:
            await endpoint.aclose()

    return asyncio.run(collect())


SAMPLED_CHECK_TEMPERATURE = 1.0
SAMPLED_CHECK_CONCURRENCY = 4


def sampled_continuations(
    engine: Engine, first_seed_index: int, timeout: float
) -> dict[str, list[list[int]]]:
    """The sampled lossless check's continuations from one engine (the engines run one after
    the other here, so each side is collected alone and the test runs afterwards)."""
    from dflash_ops.bench.core.client import Endpoint
    from dflash_ops.bench.core.lossless import collect
    from dflash_ops.bench.core.results import SampledCheckSettings
    from dflash_ops.bench.core.sampling import Sampling

    async def run() -> dict[str, list[list[int]]]:
        endpoint = Endpoint(engine.url, timeout_s=timeout)
        try:
            return await collect(
                endpoint,
                "model",
                Sampling(temperature=SAMPLED_CHECK_TEMPERATURE, ignore_eos=True),
                SampledCheckSettings(),
                SAMPLED_CHECK_CONCURRENCY,
                first_seed_index,
                engine.name,
            )
        finally:
            await endpoint.aclose()

    return asyncio.run(run())


def first_difference(a: list[int], b: list[int]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def capture_cost_ms(hidden_size: int, hc_count: int, tokens: int, layers: int) -> float:
    """GPU time of the capture's own work per decode step: the mean over the HC streams of the
    state each captured layer materializes anyway (patch 0001 reuses it)."""
    import torch

    state = torch.randn(tokens, hc_count * hidden_size, device="cuda", dtype=torch.bfloat16)
    for _ in range(10):
        state.unflatten(-1, (hc_count, hidden_size)).mean(dim=-2)  # type: ignore[no-untyped-call]
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    repeats = 200
    start.record()
    for _ in range(repeats):
        for _ in range(layers):
            state.unflatten(-1, (hc_count, hidden_size)).mean(dim=-2)  # type: ignore[no-untyped-call]
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / repeats
