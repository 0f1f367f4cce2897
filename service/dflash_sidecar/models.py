"""The sidecar's JSON payloads."""

from __future__ import annotations

from pydantic import BaseModel, Field

from dflash_sidecar.baseline import Baseline
from dflash_sidecar.engine_state import EngineState
from dflash_sidecar.verdict import Verdict


class Readiness(BaseModel):
    ready: bool
    reason: str
    state: EngineState
    checks: dict[str, bool] = Field(default_factory=dict)


class EngineLiveness(BaseModel):
    alive: bool = Field(description="false: the kubelet should restart the engine container")
    state: EngineState
    reason: str


class WindowStats(BaseModel):
    window_seconds: float
    span_seconds: float | None = Field(description="time the window's data really covers")
    drafts: float
    mean_acceptance_length: float | None
    draft_acceptance_rate: float | None
    per_position_acceptance: list[float] = Field(
        description="acceptance at each draft position; where a k schedule lowered k in the "
        "window only position 0 (drafted at any k) is measured, the rest is left out"
    )
    k_in_effect: float | None = Field(
        default=None,
        description="drafted tokens per draft: the k in effect over the window (below "
        "num_speculative_tokens where a k schedule lowered it)",
    )
    smaller_k_acceptance_length: dict[int, float] = Field(
        default_factory=dict,
        description="the mean acceptance length each smaller k would give, predicted from the "
        "per-position acceptance: 1 + the first k position rates",
    )
    output_tokens_per_s: float | None
    drafts_per_s: float | None
    verdict: Verdict
    verdict_reason: str


class SeriesStats(BaseModel):
    labels: dict[str, str]
    windows: dict[str, WindowStats]
    counter_resets: int


class ScrapeHealth(BaseModel):
    scrapes_ok: int
    scrape_errors: dict[str, int]
    parse_errors: int
    dropped_samples: dict[str, int] = Field(
        description="engine samples not used, by reason (untrusted, incomplete, inconsistent)"
    )
    last_error: str | None
    last_scrape_age_s: float | None


class StatsResponse(BaseModel):
    ready: bool
    reason: str
    engine_state: EngineState
    windows: dict[str, WindowStats] = Field(description="all series together")
    series: list[SeriesStats]
    scrape: ScrapeHealth
    baseline: Baseline | None = Field(
        default=None,
        description="the baseline the verdict judges against (its thresholds: fractions of "
        "it), with the sampling and workload it was measured on; null: the constant thresholds",
    )
