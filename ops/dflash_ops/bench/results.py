"""Typed benchmark results (the JSON written to results.json)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class SpecDecodeStats(BaseModel):
    drafts: float
    draft_tokens: float
    accepted: float
    mean_acceptance_length: float | None
    draft_acceptance_rate: float | None
    per_position_acceptance: list[float]


class Latency(BaseModel):
    mean_s: float
    p50_s: float
    p90_s: float
    max_s: float


class RunResult(BaseModel):
    concurrency: int
    requests: int
    output_tokens: int
    wall_s: float
    output_tokens_per_s: float
    latency: Latency
    spec_decode: SpecDecodeStats | None = Field(
        description="from /metrics deltas over the run; null when the server exports none"
    )


class LosslessCheck(BaseModel):
    reference_url: str
    prompts: int
    identical: int
    mismatches: list[str]

    @property
    def passed(self) -> bool:
        return self.identical == self.prompts


class BenchResult(BaseModel):
    base_url: str
    model: str
    started_at: str
    max_tokens: int
    prompt_set: list[str]
    runs: list[RunResult]
    kv_cache_tokens: int | None = Field(description="num_gpu_blocks x block_size, if reported")
    notes: list[str] = Field(default_factory=list)
    lossless: LosslessCheck | None = None
