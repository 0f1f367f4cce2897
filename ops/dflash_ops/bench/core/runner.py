"""Drive load levels against an OpenAI-compatible endpoint and measure what a serving benchmark
reports, plus speculative decoding's acceptance from the engine's /metrics.

A level is either a fixed concurrency (closed loop: that many requests in flight) or a request
rate (open loop: Poisson arrivals, optionally capped in flight). Each level runs `repeats` passes
of `num_requests` requests (or of `duration_s` seconds of arrivals); throughput is reported per
pass with its spread, latencies over every request of the level.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dflash_ops.bench.core import token_counter
from dflash_ops.bench.core.client import Endpoint, RequestRecord
from dflash_ops.bench.core.counters import (
    RUNNING_FIRST_SAMPLE_S as RUNNING_FIRST_SAMPLE_S,
)
from dflash_ops.bench.core.counters import (
    RUNNING_SAMPLE_INTERVAL_S as RUNNING_SAMPLE_INTERVAL_S,
)
from dflash_ops.bench.core.counters import Increase as Increase
from dflash_ops.bench.core.counters import SeriesId as SeriesId
from dflash_ops.bench.core.counters import Snapshot as Snapshot
from dflash_ops.bench.core.counters import increase as increase
from dflash_ops.bench.core.counters import running_requests_of as running_requests_of
from dflash_ops.bench.core.counters import sample_running as sample_running
from dflash_ops.bench.core.counters import snapshot as snapshot
from dflash_ops.bench.core.counters import snapshot_of as snapshot_of
from dflash_ops.bench.core.counters import spec_stats as spec_stats
from dflash_ops.bench.core.levels import Level as Level
from dflash_ops.bench.core.levels import LevelProgress as LevelProgress
from dflash_ops.bench.core.levels import level_label as level_label
from dflash_ops.bench.core.levels import pass_result as pass_result
from dflash_ops.bench.core.lossless import (
    Reference,
    check_lossless,
    check_sampled_lossless,
    refuse_greedy,
)
from dflash_ops.bench.core.progress import Progress as Progress
from dflash_ops.bench.core.prompts import TOKEN_SETS, Prompt, build
from dflash_ops.bench.core.results import (
    BenchResult,
    BenchSettings,
    LevelResult,
    RunResult,
    RunStatus,
    SampledCheckSettings,
)
from dflash_ops.bench.core.sampling import request_seed
from dflash_ops.errors import UserError


@dataclass(frozen=True)
class Target:
    """What a run measures: the endpoint, its model (default: the first it serves), the key it
    takes, how output tokens are counted when it sends no usage, and the reference to match."""

    base_url: str
    model: str | None = None
    api_key: str | None = None
    token_counter: Callable[[str], int] | None = None
    reference: Reference | None = None
    sampled_reference: Reference | None = None


RecordSink = Callable[[RequestRecord], None]


@dataclass
class PassOutcome:
    records: list[RequestRecord] = field(default_factory=list)
    stop_reason: str | None = None  # set when the server stopped answering
    started: float = 0.0


async def run_pass(
    endpoint: Endpoint,
    model: str,
    prompts: list[Prompt],
    level: Level,
    settings: BenchSettings,
    seed: int,
    progress: Progress,
    outcome: PassOutcome | None = None,
    on_record: RecordSink | None = None,
    *,
    repeat: int = 0,
) -> tuple[RunResult, list[RequestRecord]]:
    """One pass (`repeat`, from 0) of a level: its share of the settings' requests, or arrivals
    for its duration; its result and its own records (goodput counted against the settings'
    objectives). `seed` draws
    the arrivals and the requests' sampling seeds (each pass of a level its own).

    Records land in `outcome` as they complete (so an interrupted pass keeps them; `outcome`
    may already hold earlier passes' records). A request that cannot connect makes the pass
    probe the server; if it is gone too, no further request is issued and `outcome.stop_reason`
    says why."""
    outcome = outcome if outcome is not None else PassOutcome()
    records = outcome.records
    kept = len(records)
    started = outcome.started = time.perf_counter()
    duration_s, num_requests = settings.duration_s, settings.requests_in_run(repeat)
    deadline = None if duration_s is None else started + duration_s
    issued = 0

    def next_prompt() -> tuple[Prompt, int] | None:
        """The next request's prompt and its index in the pass."""
        nonlocal issued
        if outcome.stop_reason is not None:
            return None
        if num_requests is not None and issued >= num_requests:
            return None
        if deadline is not None and time.perf_counter() >= deadline:
            return None
        prompt = prompts[issued % len(prompts)]
        issued += 1
        return prompt, issued - 1

    async def send(prompt: Prompt, index: int) -> None:
        record = await endpoint.stream_chat(
            model,
            prompt.messages,
            prompt.max_tokens or settings.max_tokens,
            request_seed(seed, index),
        )
        record.prompt_id, record.category = prompt.id, prompt.category
        records.append(record)
        if on_record is not None:
            on_record(record)
        progress.advance(record.output_tokens)
        gone = record.error_kind == "connection" and outcome.stop_reason is None
        if gone and not await endpoint.alive():
            outcome.stop_reason = f"the server stopped answering ({record.error})"

    if level.concurrency is not None:

        async def worker() -> None:
            while (request := next_prompt()) is not None:
                await send(*request)

        await asyncio.gather(*(worker() for _ in range(level.concurrency)))
    else:
        assert level.request_rate is not None
        rng = random.Random(seed)
        cap = asyncio.Semaphore(level.max_concurrency or 1_000_000)
        tasks = []

        async def capped(prompt: Prompt, index: int) -> None:
            async with cap:
                await send(prompt, index)

        arrival = time.perf_counter()
        try:
            while (request := next_prompt()) is not None:
                tasks.append(asyncio.create_task(capped(*request)))
                arrival += rng.expovariate(level.request_rate)
                await asyncio.sleep(max(0.0, arrival - time.perf_counter()))
                if deadline is not None and arrival >= deadline:
                    break
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
    progress.close()
    mine = records[kept:]
    return pass_result(mine, started, settings.goodput), mine


async def run_level(
    endpoint: Endpoint,
    model: str,
    prompts: list[Prompt],
    level: Level,
    settings: BenchSettings,
    state: LevelProgress | None = None,
    on_record: RecordSink | None = None,
    on_run: Callable[[], None] | None = None,
) -> LevelResult:
    """Every pass of one level. `state` holds what was measured so far, so the caller can still
    report it when this is interrupted; `state.partial` says why a level stopped early."""
    state = state if state is not None else LevelProgress(level, settings.goodput)
    label = level_label(level)
    state.first = state.last = await snapshot(endpoint)
    state.saw(state.first)
    for repeat in range(settings.repeats):
        progress = Progress(
            f"{label}, run {repeat + 1}/{settings.repeats}:", settings.requests_in_run(repeat)
        )
        outcome = PassOutcome(records=state.records)
        before = state.last
        state.pass_kept = len(state.records)
        state.pass_started = time.perf_counter()
        sampler = asyncio.create_task(sample_running(endpoint, state.running_samples))
        try:
            run, _ = await run_pass(
                endpoint, model, prompts, level, settings, settings.seed + repeat, progress,
                outcome, on_record, repeat=repeat,
            )  # fmt: skip
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
        if outcome.stop_reason is not None:
            state.runs.append(run)
            state.pass_kept = len(state.records)
            state.partial = outcome.stop_reason
            break
        after = state.last = await snapshot(endpoint)
        state.saw(after)
        counted = increase(before, after)
        if counted.restarted:
            state.restarted_runs.append(repeat + 1)
            run.engine_restarted = True
        if counted.inconsistent:
            state.withheld[repeat + 1] = (
                "a counter went back while its engine kept running: that engine is left out"
            )
        stats = spec_stats(counted.delta) if after.speculating else None
        if isinstance(stats, str):
            state.withheld[repeat + 1] = stats
        elif stats is not None and counted.delta is not None:
            run.spec_decode = stats
            state.deltas.append(counted.delta)
        state.runs.append(run)
        state.pass_kept = len(state.records)
        print(
            f"  {label}, run {repeat + 1}/{settings.repeats}: {run.requests} ok, {run.failed} "
            f"failed, {run.output_tokens} tokens in {run.wall_s:.1f}s = "
            f"{run.output_tokens_per_s:.1f} tok/s"
            + (" (the engine restarted)" if run.engine_restarted else ""),
            file=sys.stderr,
        )
        if on_run is not None:
            on_run()
    if not any(r.ok for r in state.records) and state.partial is None:
        first = next((r.error for r in state.records if r.error), "no request was sent")
        state.partial = f"every request at {label} failed; the first: {first}"
    result = state.result()
    if result is None:
        raise UserError(f"no request was sent at {label}")
    return result


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


class BenchStopped(Exception):
    """The run ended before its last level; `result` holds what it measured."""

    def __init__(self, result: BenchResult) -> None:
        super().__init__(result.stop_reason)
        self.result = result


ResultSink = Callable[[BenchResult], None]
# Chooses the next level from those measured so far (None: done), e.g. a saturation search.
LevelPlan = Callable[[list[LevelResult]], Level | None]


def fixed_plan(levels: list[Level]) -> LevelPlan:
    return lambda done: levels[len(done)] if len(done) < len(levels) else None


@dataclass
class RunState:
    """What a run has measured so far (the levels done, the one in progress, notes) and how it
    reports it: every snapshot is a whole BenchResult, handed to `on_result`."""

    endpoint: Endpoint
    settings: BenchSettings
    on_result: ResultSink | None
    model: str = ""
    started_at: str = field(default_factory=now_iso)
    done: list[LevelResult] = field(default_factory=list)
    current: LevelProgress | None = None
    notes: list[str] = field(default_factory=list)
    kv_tokens: int | None = None

    def snapshot(self, status: RunStatus, reason: str | None = None) -> BenchResult:
        levels_so_far = list(self.done)
        if self.current is not None and (partial := self.current.result()) is not None:
            if status == "interrupted" and partial.partial is None:
                partial.partial = "interrupted (Ctrl-C or SIGTERM)"
            levels_so_far.append(partial)
        return BenchResult(
            base_url=self.endpoint.base_url,
            model=self.model,
            started_at=self.started_at,
            finished_at=None if status == "running" else now_iso(),
            status=status,
            stop_reason=reason,
            settings=self.settings,
            levels=levels_so_far,
            kv_cache_tokens=self.kv_tokens,
            notes=self.notes,
        )

    def publish(self, status: RunStatus, reason: str | None = None) -> BenchResult:
        result = self.snapshot(status, reason)
        if self.on_result is not None:
            self.on_result(result)
        return result

    def still_running(self) -> None:
        self.publish("running")

    @property
    def measured_anything(self) -> bool:
        return bool(self.done) or self.current is not None


async def prompts_for(endpoint: Endpoint, model: str, settings: BenchSettings) -> list[Prompt]:
    """The run's prompt set; a set sized in tokens loads the served model's tokenizer (or
    --tokenizer's)."""
    tokenizer = None
    if settings.prompt_set in TOKEN_SETS:
        needed = f"--dataset-name {settings.prompt_set} is sized in tokens"
        if settings.tokenizer:
            tokenizer = token_counter.load_tokenizer(settings.tokenizer, needed)
        else:
            root = await endpoint.model_root(model)
            tokenizer = token_counter.load_tokenizer(root, needed, served_from=model)
    count = max(settings.requests_in_run(0) or 64, 1)
    return build(
        settings.prompt_set, count, settings.random_shape(), settings.seed,
        settings.prefix_groups, tokenizer,
    )  # fmt: skip


async def warm_up(run: RunState, prompts: list[Prompt]) -> None:
    """The warm-up requests, then what the server exports: a note when it has no speculative
    counters, and its KV-cache size."""
    endpoint, model = run.endpoint, run.model
    print(
        f"warm-up: {run.settings.warmup} requests to {endpoint.base_url} ({model})",
        file=sys.stderr,
    )
    for prompt in prompts[: run.settings.warmup]:
        record = await endpoint.stream_chat(model, prompt.messages, 8)
        if not record.ok:
            raise UserError(f"the warm-up request failed: {record.error}")
    if await endpoint.counters() is None:
        run.notes.append(
            "the server exports no vllm:spec_decode_* counters: speculative decoding is "
            "off or this is not vLLM; acceptance is not reported"
        )
        print(f"note: {run.notes[-1]}", file=sys.stderr)
    run.kv_tokens = await endpoint.kv_cache_tokens()


async def run_bench(
    target: Target,
    levels: list[Level] | LevelPlan,
    settings: BenchSettings,
    prompts: list[Prompt] | None = None,
    on_result: ResultSink | None = None,
    on_record: Callable[[str, int, RequestRecord], None] | None = None,
    on_level: Callable[[LevelResult], None] | None = None,
) -> BenchResult:
    """Every level in turn. `on_result` gets the result so far after every pass and level (and
    once more at the end, however the run ends); `on_record` every request as it completes;
    `on_level` every level measured in full, as it ends (before the next one starts). A
    level that stops early (the server went away, every request failed) ends the run: the
    BenchStopped raised carries everything measured, as does an interrupt (`on_result` saw it)."""
    endpoint = Endpoint(
        target.base_url,
        timeout_s=settings.request_timeout_s,
        api_key=target.api_key,
        token_counter=target.token_counter,
        metrics_urls=settings.metrics_urls,
        sampling=settings.sampling,
        api_path=settings.endpoint,
    )
    run = RunState(endpoint, settings, on_result, model=target.model or "")
    compared = target.reference
    reference = Endpoint(compared.url, api_key=target.api_key) if compared else None
    reference_model = compared.model if compared else None
    sampled = target.sampled_reference
    if sampled is not None:
        refuse_greedy(settings.sampling)
    sampled_endpoint = Endpoint(sampled.url, api_key=target.api_key) if sampled else None
    try:
        model = run.model = await endpoint.model_to_use(target.model)
        if reference is not None:  # before the run, not after it
            await reference.check_model(reference_model or model)
        if sampled_endpoint is not None and sampled is not None:
            await sampled_endpoint.check_model(sampled.model or model)
        if prompts is None:
            prompts = await prompts_for(endpoint, model, settings)
        await warm_up(run, prompts)
        run.publish("running")
        plan = fixed_plan(levels) if isinstance(levels, list) else levels
        while (level := plan(run.done)) is not None:
            label = level_label(level)
            state = run.current = LevelProgress(level, settings.goodput)

            def record_of(
                record: RequestRecord, label: str = label, state: LevelProgress = state
            ) -> None:
                if on_record is not None:
                    on_record(label, len(state.runs) + 1, record)

            result = await run_level(
                endpoint, model, prompts, level, settings, state, record_of, run.still_running
            )
            run.current = None
            run.done.append(result)
            if result.partial is not None:
                stopped = run.publish("failed", f"{result.label}: {result.partial}")
                raise BenchStopped(stopped)
            run.publish("running")
            if on_level is not None:
                on_level(result)
        lossless = None
        if reference is not None and compared is not None:
            lossless = await check_lossless(
                endpoint,
                reference,
                model,
                reference_model or model,
                settings.max_tokens,
                list(compared.concurrency),
            )
        sampled_checks = None
        if sampled_endpoint is not None and sampled is not None:
            sampled_checks = await check_sampled_lossless(
                endpoint,
                sampled_endpoint,
                model,
                sampled.model or model,
                settings.sampling,
                list(sampled.concurrency),
                sampled.sampled or SampledCheckSettings(),
            )
        final = run.snapshot("complete").model_copy(
            update={"lossless": lossless, "sampled_lossless": sampled_checks}
        )
        if on_result is not None:
            on_result(final)
        return final
    except asyncio.CancelledError:
        run.publish("interrupted", "interrupted (Ctrl-C or SIGTERM)")
        raise
    except UserError as err:
        if run.measured_anything:
            run.publish("failed", str(err))
        raise
    finally:
        await endpoint.aclose()
        if reference is not None:
            await reference.aclose()
        if sampled_endpoint is not None:
            await sampled_endpoint.aclose()
