"""Run the fixed prompt set at each concurrency and measure throughput and acceptance."""

from __future__ import annotations

import asyncio
import datetime
import json
import statistics
import sys
import time
from importlib import resources

from dflash_sidecar.acceptance_window import acceptance_ratios
from dflash_sidecar.exposition import SeriesSample

from dflash_ops.bench.client import Endpoint
from dflash_ops.bench.results import (
    BenchResult,
    Latency,
    LosslessCheck,
    RunResult,
    SpecDecodeStats,
)


def load_prompts() -> list[tuple[str, str]]:
    data = json.loads(resources.files("dflash_ops.data").joinpath("bench_prompts.json").read_text())
    return [(p["id"], p["text"]) for p in data["prompts"]]


class Progress:
    """One self-rewriting stderr line: `c=4 [#####.....] 5/10 requests, 640 tokens`."""

    def __init__(self, label: str, total: int, stream=sys.stderr) -> None:  # type: ignore[no-untyped-def]
        self.label, self.total, self.done, self.tokens = label, total, 0, 0
        self.stream = stream

    def advance(self, tokens: int) -> None:
        self.done += 1
        self.tokens += tokens
        # On a terminal the line rewrites itself; in a log, print quarters only.
        if not self.stream.isatty() and self.done not in {
            self.total * q // 4 for q in (1, 2, 3, 4)
        }:
            return
        end = "\r" if self.stream.isatty() else "\n"
        width = 20
        filled = width * self.done // self.total
        self.stream.write(
            f"  {self.label} [{'#' * filled}{'.' * (width - filled)}] "
            f"{self.done}/{self.total} requests, {self.tokens} tokens{end}"
        )
        if self.done == self.total and end == "\r":
            self.stream.write("\n")
        self.stream.flush()


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


async def _run_concurrency(
    endpoint: Endpoint, model: str, prompts: list[str], concurrency: int, max_tokens: int
) -> RunResult:
    queue: asyncio.Queue[str] = asyncio.Queue()
    for prompt in prompts:
        queue.put_nowait(prompt)
    progress = Progress(f"concurrency {concurrency}", len(prompts))
    latencies: list[float] = []
    tokens = 0

    async def worker() -> None:
        nonlocal tokens
        while not queue.empty():
            prompt = queue.get_nowait()
            _, count, latency = await endpoint.chat(model, prompt, max_tokens)
            latencies.append(latency)
            tokens += count
            progress.advance(count)

    before = await endpoint.counters()
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    after = await endpoint.counters()
    ordered = sorted(latencies)
    return RunResult(
        concurrency=concurrency,
        requests=len(prompts),
        output_tokens=tokens,
        wall_s=wall,
        output_tokens_per_s=tokens / wall,
        latency=Latency(
            mean_s=statistics.fmean(ordered),
            p50_s=ordered[len(ordered) // 2],
            p90_s=ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))],
            max_s=ordered[-1],
        ),
        spec_decode=spec_delta(before, after),
    )


async def check_lossless(
    endpoint: Endpoint, reference: Endpoint, model: str, reference_model: str, max_tokens: int
) -> LosslessCheck:
    prompts = load_prompts()
    mismatches = []
    progress = Progress("lossless", len(prompts))
    for prompt_id, text in prompts:
        (ours, count, _), (theirs, _, _) = await asyncio.gather(
            endpoint.chat(model, text, max_tokens),
            reference.chat(reference_model, text, max_tokens),
        )
        if ours != theirs:
            first = next(
                (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None
            )
            mismatches.append(f"{prompt_id}: first differing token at {first}")
        progress.advance(count)
    return LosslessCheck(
        reference_url=reference.base_url,
        prompts=len(prompts),
        identical=len(prompts) - len(mismatches),
        mismatches=mismatches,
    )


async def run_bench(
    base_url: str,
    model: str,
    concurrency: list[int],
    max_tokens: int,
    repeats: int = 1,
    reference_url: str | None = None,
    reference_model: str | None = None,
) -> BenchResult:
    endpoint = Endpoint(base_url)
    reference = Endpoint(reference_url) if reference_url else None
    try:
        await endpoint.check_model(model)
        prompts = load_prompts()
        texts = [text for _, text in prompts] * repeats
        print(f"warm-up request to {base_url} ({model})", file=sys.stderr)
        await endpoint.chat(model, texts[0], 8)
        notes = []
        if await endpoint.counters() is None:
            notes.append(
                "the server exports no vllm:spec_decode_* counters: speculative decoding is "
                "off or this is not vLLM; acceptance is not reported"
            )
            print(f"note: {notes[-1]}", file=sys.stderr)
        runs = [await _run_concurrency(endpoint, model, texts, c, max_tokens) for c in concurrency]
        lossless = None
        if reference is not None:
            await reference.check_model(reference_model or model)
            lossless = await check_lossless(
                endpoint, reference, model, reference_model or model, max_tokens
            )
        return BenchResult(
            base_url=endpoint.base_url,
            model=model,
            started_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            max_tokens=max_tokens,
            prompt_set=[prompt_id for prompt_id, _ in prompts],
            runs=runs,
            kv_cache_tokens=await endpoint.kv_cache_tokens(),
            notes=notes,
            lossless=lossless,
        )
    finally:
        await endpoint.aclose()
        if reference is not None:
            await reference.aclose()
