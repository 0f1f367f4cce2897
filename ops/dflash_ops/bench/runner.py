"""Drive load levels against an OpenAI-compatible endpoint and measure what a serving benchmark
reports, plus speculative decoding's acceptance from the engine's /metrics.

A level is either a fixed concurrency (closed loop: that many requests in flight) or a request
rate (open loop: Poisson arrivals, optionally capped in flight). Each level runs `repeats` passes
of `num_requests` requests (or of `duration_s` seconds of arrivals); throughput is reported per
pass with its spread, latencies over every request of the level.
"""

from __future__ import annotations

import asyncio
import datetime
import random
import sys
import time
from dataclasses import dataclass
from typing import TextIO

from dflash_sidecar.acceptance_window import acceptance_ratios
from dflash_sidecar.metrics_parser import SeriesSample

from dflash_ops.bench.client import Endpoint, RequestRecord
from dflash_ops.bench.prompts import Prompt, build, fixed_prompts
from dflash_ops.bench.results import (
    BenchResult,
    BenchSettings,
    LevelResult,
    LosslessCheck,
    Percentiles,
    PrefixCacheStats,
    RunResult,
    SpecDecodeStats,
    Spread,
)
from dflash_ops.errors import UserError


@dataclass(frozen=True)
class Level:
    concurrency: int | None = None
    request_rate: float | None = None
    max_concurrency: int | None = None


class Progress:
    """One self-rewriting stderr line on a terminal; quarters only in a log."""

    def __init__(self, label: str, total: int | None, stream: TextIO = sys.stderr) -> None:
        self.label, self.total, self.done, self.tokens = label, total, 0, 0
        self.stream = stream
        self.tty = stream.isatty()
        self.started = time.perf_counter()

    def advance(self, tokens: int) -> None:
        self.done += 1
        self.tokens += tokens
        if self.total is None:
            if self.tty or self.done % 50 == 0:
                self._write(f"{self.done} requests")
            return
        if self.tty or self.done in {self.total * q // 4 for q in (1, 2, 3, 4)}:
            width = 20
            filled = width * self.done // max(self.total, 1)
            self._write(f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}")

    def _write(self, what: str) -> None:
        elapsed = time.perf_counter() - self.started
        end = "\r" if self.tty else "\n"
        self.stream.write(
            f"  {self.label} {what} requests, {self.tokens} tokens, {elapsed:.0f}s{end}"
        )
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")


def spec_delta(before: SeriesSample | None, after: SeriesSample | None) -> SpecDecodeStats | None:
    if before is None or after is None:
        return None
    drafts = after.drafts - before.drafts
    draft_tokens = after.draft_tokens - before.draft_tokens
    accepted = after.accepted - before.accepted
    positions = range(max(after.accepted_per_pos, default=-1) + 1)
    per_pos = [
        after.accepted_per_pos.get(i, 0.0) - before.accepted_per_pos.get(i, 0.0) for i in positions
    ]
    mal, rate, per_position = acceptance_ratios(drafts, draft_tokens, accepted, per_pos)
    return SpecDecodeStats(
        drafts=drafts,
        draft_tokens=draft_tokens,
        accepted=accepted,
        mean_acceptance_length=mal,
        draft_acceptance_rate=rate,
        per_position_acceptance=per_position,
    )


async def run_pass(
    endpoint: Endpoint,
    model: str,
    prompts: list[Prompt],
    level: Level,
    max_tokens: int,
    num_requests: int | None,
    duration_s: float | None,
    seed: int,
    progress: Progress,
) -> tuple[RunResult, list[RequestRecord]]:
    """One pass of a level: `num_requests` requests, or arrivals for `duration_s` seconds."""
    records: list[RequestRecord] = []
    started = time.perf_counter()
    deadline = None if duration_s is None else started + duration_s
    issued = 0

    def next_prompt() -> Prompt | None:
        nonlocal issued
        if num_requests is not None and issued >= num_requests:
            return None
        if deadline is not None and time.perf_counter() >= deadline:
            return None
        prompt = prompts[issued % len(prompts)]
        issued += 1
        return prompt

    async def send(prompt: Prompt) -> None:
        record = await endpoint.stream_chat(model, prompt.messages, max_tokens)
        records.append(record)
        progress.advance(record.output_tokens)

    if level.concurrency is not None:

        async def worker() -> None:
            while (prompt := next_prompt()) is not None:
                await send(prompt)

        await asyncio.gather(*(worker() for _ in range(level.concurrency)))
    else:
        assert level.request_rate is not None
        rng = random.Random(seed)
        cap = asyncio.Semaphore(level.max_concurrency or 1_000_000)
        tasks = []

        async def capped(prompt: Prompt) -> None:
            async with cap:
                await send(prompt)

        arrival = time.perf_counter()
        while (prompt := next_prompt()) is not None:
            tasks.append(asyncio.create_task(capped(prompt)))
            arrival += rng.expovariate(level.request_rate)
            await asyncio.sleep(max(0.0, arrival - time.perf_counter()))
            if deadline is not None and arrival >= deadline:
                break
        await asyncio.gather(*tasks)
    progress.close()
    ok = [r for r in records if r.ok]
    first = min((r.start for r in records), default=started)
    last = max((r.end for r in records), default=started)
    wall = max(last - first, 1e-9)
    output = sum(r.output_tokens for r in ok)
    return (
        RunResult(
            requests=len(ok),
            failed=len(records) - len(ok),
            output_tokens=output,
            prompt_tokens=sum(r.prompt_tokens for r in ok),
            wall_s=wall,
            output_tokens_per_s=output / wall,
            requests_per_s=len(ok) / wall,
        ),
        records,
    )


async def run_level(
    endpoint: Endpoint,
    model: str,
    prompts: list[Prompt],
    level: Level,
    settings: BenchSettings,
) -> LevelResult:
    runs: list[RunResult] = []
    records: list[RequestRecord] = []
    label = (
        f"concurrency {level.concurrency}"
        if level.concurrency is not None
        else f"rate {level.request_rate:g}/s"
    )
    counters_before = await endpoint.counters()
    prefix_before = await endpoint.prefix_cache()
    for repeat in range(settings.repeats):
        progress = Progress(f"{label}, run {repeat + 1}/{settings.repeats}:", settings.num_requests)
        run, run_records = await run_pass(
            endpoint,
            model,
            prompts,
            level,
            settings.max_tokens,
            settings.num_requests,
            settings.duration_s,
            settings.seed + repeat,
            progress,
        )
        print(
            f"  {label}, run {repeat + 1}/{settings.repeats}: {run.requests} ok, {run.failed} "
            f"failed, {run.output_tokens} tokens in {run.wall_s:.1f}s = "
            f"{run.output_tokens_per_s:.1f} tok/s",
            file=sys.stderr,
        )
        runs.append(run)
        records += run_records
    counters_after = await endpoint.counters()
    prefix_after = await endpoint.prefix_cache()
    ok = [r for r in records if r.ok]
    if not ok:
        first = next((r.error for r in records if r.error), "no request was sent")
        raise UserError(f"every request at {label} failed; the first: {first}")
    prefix = None
    if prefix_before is not None and prefix_after is not None:
        hits, queries = (prefix_after[0] - prefix_before[0], prefix_after[1] - prefix_before[1])
        prefix = PrefixCacheStats(
            queried_tokens=queries, hit_tokens=hits, hit_rate=hits / queries if queries else None
        )
    return LevelResult(
        concurrency=level.concurrency,
        request_rate=level.request_rate,
        max_concurrency=level.max_concurrency,
        runs=runs,
        output_tokens_per_s=Spread.of([r.output_tokens_per_s for r in runs]),
        requests_per_s=Spread.of([r.requests_per_s for r in runs]),
        ttft_ms=Percentiles.of_seconds([r.ttft_s for r in ok if r.ttft_s is not None]),
        tpot_ms=Percentiles.of_seconds([t for r in ok if (t := r.tpot_s) is not None]),
        itl_ms=Percentiles.of_seconds([gap for r in ok for gap in r.chunk_gaps_s]),
        e2e_ms=Percentiles.of_seconds([r.latency_s for r in ok]),
        spec_decode=spec_delta(counters_before, counters_after),
        prefix_cache=prefix,
        errors=[r.error for r in records if r.error][:5],
    )


async def check_lossless(
    endpoint: Endpoint,
    reference: Endpoint,
    model: str,
    reference_model: str,
    max_tokens: int,
    concurrency: list[int],
) -> LosslessCheck:
    """Greedy outputs with speculation must equal the reference's token for token, at each
    concurrency (batch shapes change numerics); the reference must not speculate, and both
    sides must return tokens."""
    prompts = fixed_prompts()
    mismatches: list[str] = []
    checked = identical = 0
    ref_before = await reference.counters()
    for level in concurrency:
        limit = asyncio.Semaphore(level)

        async def both(
            prompt_id: str, text: str, limit: asyncio.Semaphore = limit
        ) -> tuple[str, list[int], list[int]]:
            messages = [{"role": "user", "content": text}]
            async with limit:
                ours, theirs = await asyncio.gather(
                    endpoint.chat_token_ids(model, messages, max_tokens),
                    reference.chat_token_ids(reference_model, messages, max_tokens),
                )
            return prompt_id, ours, theirs

        print(f"  lossless check at concurrency {level}: {len(prompts)} prompts", file=sys.stderr)
        for prompt_id, ours, theirs in await asyncio.gather(*(both(i, t) for i, t in prompts)):
            checked += 1
            if not ours or not theirs:
                raise UserError(
                    f"the lossless check needs token ids, and {prompt_id} returned none from "
                    f"{endpoint.base_url if not ours else reference.base_url} (a vLLM server "
                    "returns them for `return_token_ids`)"
                )
            if ours == theirs:
                identical += 1
                continue
            first = next(
                (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
                min(len(ours), len(theirs)),
            )
            mismatches.append(
                f"{prompt_id} at concurrency {level}: first differing token at {first}"
            )
    ref_after = await reference.counters()
    if ref_after is not None and (ref_before is None or ref_after.drafts > ref_before.drafts):
        raise UserError(
            f"the lossless reference {reference.base_url} drafted tokens during the check: it "
            "serves with speculative decoding. Point --check-lossless at the same model served "
            "without --speculative-config."
        )
    return LosslessCheck(
        reference_url=reference.base_url,
        concurrency=concurrency,
        prompts=checked,
        identical=identical,
        mismatches=mismatches,
    )


async def run_bench(
    base_url: str,
    model: str | None,
    levels: list[Level],
    settings: BenchSettings,
    reference_url: str | None = None,
    reference_model: str | None = None,
    lossless_concurrency: tuple[int, ...] = (1, 4),
    api_key: str | None = None,
) -> BenchResult:
    endpoint = Endpoint(base_url, api_key=api_key)
    reference = Endpoint(reference_url, api_key=api_key) if reference_url else None
    try:
        if model is None:
            served = await endpoint.models()
            if not served:
                raise UserError(f"{endpoint.base_url} serves no model")
            model = served[0]
        await endpoint.check_model(model)
        if reference is not None:  # before the run, not after it
            await reference.check_model(reference_model or model)
        count = settings.num_requests or 64
        prompts = build(settings.prompt_set, count, settings.input_len, settings.seed)
        print(
            f"warm-up: {settings.warmup} requests to {endpoint.base_url} ({model})",
            file=sys.stderr,
        )
        for prompt in prompts[: settings.warmup]:
            record = await endpoint.stream_chat(model, prompt.messages, 8)
            if not record.ok:
                raise UserError(f"the warm-up request failed: {record.error}")
        notes = []
        if await endpoint.counters() is None:
            notes.append(
                "the server exports no vllm:spec_decode_* counters: speculative decoding is "
                "off or this is not vLLM; acceptance is not reported"
            )
            print(f"note: {notes[-1]}", file=sys.stderr)
        results = [await run_level(endpoint, model, prompts, level, settings) for level in levels]
        lossless = None
        if reference is not None:
            lossless = await check_lossless(
                endpoint,
                reference,
                model,
                reference_model or model,
                settings.max_tokens,
                list(lossless_concurrency),
            )
        return BenchResult(
            base_url=endpoint.base_url,
            model=model,
            started_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            settings=settings,
            levels=results,
            kv_cache_tokens=await endpoint.kv_cache_tokens(),
            notes=notes,
            lossless=lossless,
        )
    finally:
        await endpoint.aclose()
        if reference is not None:
            await reference.aclose()
