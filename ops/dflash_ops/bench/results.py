"""Typed benchmark results (the JSON written to results.json)."""

from __future__ import annotations

import math
import statistics

from pydantic import BaseModel, Field

from dflash_ops.bench.prompts import PromptSetName


class Spread(BaseModel):
    """A figure over repeated runs: mean, min, max and sample standard deviation."""

    mean: float
    min: float
    max: float
    stdev: float
    runs: int

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        return cls(
            mean=statistics.fmean(values),
            min=min(values),
            max=max(values),
            stdev=statistics.stdev(values) if len(values) > 1 else 0.0,
            runs=len(values),
        )


class Percentiles(BaseModel):
    """Milliseconds over every request (or chunk gap) of a level, all repeats together."""

    mean: float
    p50: float
    p90: float
    p99: float
    count: int

    @classmethod
    def of_seconds(cls, values: list[float]) -> Percentiles | None:
        if not values:
            return None
        ordered = sorted(v * 1000 for v in values)

        def pick(q: float) -> float:
            return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

        return cls(
            mean=statistics.fmean(ordered),
            p50=pick(0.5),
            p90=pick(0.9),
            p99=pick(0.99),
            count=len(ordered),
        )


class SpecDecodeStats(BaseModel):
    drafts: float
    draft_tokens: float
    accepted: float
    mean_acceptance_length: float | None
    draft_acceptance_rate: float | None
    per_position_acceptance: list[float]


class PrefixCacheStats(BaseModel):
    queried_tokens: float
    hit_tokens: float
    hit_rate: float | None


class RunResult(BaseModel):
    """One pass at one level."""

    requests: int
    failed: int
    output_tokens: int
    prompt_tokens: int
    wall_s: float
    output_tokens_per_s: float
    requests_per_s: float


class LevelResult(BaseModel):
    """One load level: a fixed concurrency (closed loop) or a request rate (Poisson arrivals)."""

    concurrency: int | None = Field(description="in-flight requests; null in request-rate mode")
    request_rate: float | None = Field(description="Poisson arrivals per second, or null")
    max_concurrency: int | None = None
    runs: list[RunResult]
    output_tokens_per_s: Spread
    requests_per_s: Spread
    ttft_ms: Percentiles | None
    tpot_ms: Percentiles | None
    itl_ms: Percentiles | None = Field(
        description="gaps between streamed chunks: one per engine step (up to k + 1 tokens)"
    )
    e2e_ms: Percentiles | None
    spec_decode: SpecDecodeStats | None = Field(
        description="from /metrics deltas over every run of the level; null when none exported"
    )
    prefix_cache: PrefixCacheStats | None = None
    errors: list[str] = Field(default_factory=list, description="first few failed requests")

    @property
    def label(self) -> str:
        if self.request_rate is not None:
            cap = f", max {self.max_concurrency} in flight" if self.max_concurrency else ""
            return f"rate {self.request_rate:g}/s{cap}"
        return f"concurrency {self.concurrency}"


class LosslessCheck(BaseModel):
    reference_url: str
    concurrency: list[int]
    prompts: int
    identical: int
    mismatches: list[str]

    @property
    def passed(self) -> bool:
        return self.prompts > 0 and self.identical == self.prompts


class BenchSettings(BaseModel):
    prompt_set: PromptSetName
    input_len: int
    max_tokens: int
    num_requests: int | None
    duration_s: float | None
    repeats: int
    warmup: int
    seed: int


class BenchResult(BaseModel):
    base_url: str
    model: str
    started_at: str
    settings: BenchSettings
    levels: list[LevelResult]
    kv_cache_tokens: int | None = Field(description="num_gpu_blocks x block_size, if reported")
    notes: list[str] = Field(default_factory=list)
    lossless: LosslessCheck | None = None
