"""Typed benchmark results (the JSON written to results.json)."""

from __future__ import annotations

import statistics
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dflash_ops.bench.core.categories import CategoryFigures
from dflash_ops.bench.core.prompts import PromptSetName, RandomShape
from dflash_ops.bench.core.sampling import Sampling

DEFAULT_REQUEST_TIMEOUT_S = 300.0
# How a run ended: every level measured, stopped by the user, or stopped by a failure.
RunStatus = Literal["running", "complete", "interrupted", "failed", "died"]
# How a request's output tokens were counted: the server's usage chunk, or the model's tokenizer.
TokenCountSource = Literal["usage", "tokenizer"]


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


def percentile(ordered: list[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) of sorted values, interpolated linearly between the two
    nearest ranks (numpy's default): p99 of 20 samples is not simply the largest one."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class Percentiles(BaseModel):
    """Milliseconds over every request (or chunk gap) of a level, all repeats together;
    `count` is the number of samples (a p99 of a few dozen samples is a rough figure)."""

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
            return percentile(ordered, q)

        return cls(
            mean=statistics.fmean(ordered),
            p50=pick(0.5),
            p90=pick(0.9),
            p99=pick(0.99),
            count=len(ordered),
        )


class RunningBatch(BaseModel):
    """The engine's running batch during a level: vllm:num_requests_running (summed over the
    engines counted) sampled about once a second while requests were in flight. What a k
    schedule keys on (running requests), as opposed to the client's nominal concurrency."""

    mean: float
    p50: float
    p90: float
    max: float
    samples: int

    @classmethod
    def of(cls, values: list[float]) -> RunningBatch | None:
        if not values:
            return None
        ordered = sorted(values)
        return cls(
            mean=statistics.fmean(ordered),
            p50=percentile(ordered, 0.5),
            p90=percentile(ordered, 0.9),
            max=ordered[-1],
            samples=len(ordered),
        )


class SpecDecodeStats(BaseModel):
    drafts: float
    draft_tokens: float
    accepted: float
    mean_acceptance_length: float | None
    draft_acceptance_rate: float | None
    per_position_acceptance: list[float]
    k_in_effect: float | None = Field(
        default=None,
        description="drafted tokens per draft: the k the engine drafted at on average (below "
        "num_speculative_tokens where a k schedule lowered it for the running batch size)",
    )


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
    good_requests: int | None = Field(
        default=None, description="requests that met every --goodput objective"
    )
    goodput_requests_per_s: float | None = None
    engine_restarted: bool = Field(
        default=False,
        description="an engine's generation counter went back during this pass: it restarted, "
        "so its counters are left out of this pass's acceptance (the sidecar's rule)",
    )
    spec_decode: SpecDecodeStats | None = Field(
        default=None,
        description="this pass's /metrics deltas, by the sidecar's formula; null when no engine "
        "was counted throughout the pass or the figures would be impossible",
    )


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
    running_batch: RunningBatch | None = Field(
        default=None,
        description="the engine's running requests during the level; null when /metrics had no "
        "vllm:num_requests_running or the level was too short to sample",
    )
    replica_share: dict[str, float] | None = Field(
        default=None,
        description="each --metrics-url engine's share of the requests it finished "
        "(vllm:request_success_total deltas); null with one engine",
    )
    errors: list[str] = Field(default_factory=list, description="first few failed requests")
    failures: dict[str, int] = Field(
        default_factory=dict,
        description="failed requests by kind: http (an error status), timeout "
        "(--request-timeout), connection (refused or cut), protocol (a malformed stream)",
    )
    goodput_requests_per_s: Spread | None = Field(
        default=None, description="requests per second that met every --goodput objective"
    )
    slo_attainment: float | None = Field(
        default=None, description="share of the level's requests that met every objective"
    )
    token_count_source: TokenCountSource = "usage"
    partial: str | None = Field(
        default=None, description="why the level stopped before its last run, if it did"
    )
    engines_counted: list[str] = Field(
        default_factory=list,
        description="the engines whose /metrics were read at every snapshot of the level: the "
        "acceptance and prefix-cache figures are theirs",
    )
    engines_unread: list[str] = Field(
        default_factory=list,
        description="engines whose /metrics did not answer (in time) at some snapshot: left out",
    )
    categories: dict[str, CategoryFigures] | None = Field(
        default=None,
        description="per prompt category (spec_bench): requests, and tokens per streamed step",
    )
    notes: list[str] = Field(default_factory=list)

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


class SiteFinding(BaseModel):
    """A (prompt, position) whose next-token distribution differs between the sides (adjusted
    p at most alpha), or, when only the sites together differ, one where the evidence is
    strongest."""

    model_config = ConfigDict(frozen=True)

    prompt: str
    position: int
    adjusted_p: float
    detail: str


class SampledCheckSettings(BaseModel):
    """How much the sampled check samples (per prompt and side) and how strict it is."""

    model_config = ConfigDict(frozen=True)

    prompts: int = Field(default=4, ge=1, le=10, description="of the fixed prompts")
    samples: int = Field(default=200, ge=10, le=100_000, description="per prompt and side")
    tokens: int = Field(default=8, ge=2, le=256, description="generated per continuation")
    alpha: float = Field(default=0.01, gt=0, lt=1, description="the false-alarm rate allowed")
    permutations: int = Field(default=999, ge=99, le=100_000)
    seed: int = 0


class SampledLosslessCheck(BaseModel):
    reference_url: str
    sampling: str
    concurrency: int
    prompts: int
    samples_per_side: int
    tokens: int
    alpha: float
    p_value: float
    permutations: int
    findings: list[SiteFinding]
    seconds: float

    @property
    def passed(self) -> bool:
        return self.p_value > self.alpha

    def summary(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        return (
            f"sampled outputs vs {self.reference_url} at concurrency {self.concurrency} "
            f"({self.sampling}): {verdict}, p = {self.p_value:.3g} against alpha "
            f"{self.alpha:g} ({self.samples_per_side} continuations of {self.tokens} tokens "
            f"per side over {self.prompts} prompts, {self.permutations} permutations, "
            f"{self.seconds:.0f} s)"
        )


PercentileMetric = Literal["ttft", "tpot", "itl", "e2el"]


def _default_percentile_metrics() -> list[PercentileMetric]:
    return ["ttft", "tpot", "itl"]  # vllm bench serve's for generative models


class BenchSettings(BaseModel):
    prompt_set: PromptSetName
    input_len: int
    max_tokens: int
    num_requests: int | None = Field(description="requests per run (--num-requests)")
    duration_s: float | None
    repeats: int
    warmup: int
    seed: int
    total_requests: int | None = Field(
        default=None,
        description="requests per level, spread over its runs (--num-prompts, as vllm bench "
        "serve counts them); when set, it decides each run's count",
    )
    input_unit: Literal["tokens", "words"] = Field(
        default="words",
        description="what input_len counts: tokens of the served model's tokenizer (as vllm "
        "bench serve); words in results written before",
    )
    output_len: int | None = Field(
        default=None,
        description="output tokens per request: random (--random-output-len), spec_bench "
        "(--spec-bench-output-len)",
    )
    dataset_category: str | None = Field(
        default=None, description="spec_bench: the one category run (--spec-bench-category)"
    )
    input_range_ratio: float = 0.0
    output_range_ratio: float = 0.0
    prefix_len: int = Field(default=0, description="random: shared prefix tokens")
    endpoint: Literal["/v1/chat/completions", "/v1/completions"] = Field(
        default="/v1/chat/completions",
        description="the API the requests went to (--endpoint): chat applies the model's chat "
        "template, completions sends the prompt as written",
    )
    label: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    percentile_metrics: list[PercentileMetric] = Field(
        default_factory=_default_percentile_metrics,
        description="the metrics the vLLM-format export gives percentiles of",
    )
    metric_percentiles: list[float] = Field(default_factory=lambda: [99.0])
    dataset_path: str | None = None
    prefix_groups: int = 1
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    goodput: dict[str, float] = Field(
        default_factory=dict, description="objectives in ms: ttft, tpot, e2e (--goodput)"
    )
    tokenizer: str | None = None
    metrics_urls: list[str] = Field(
        default_factory=list,
        description="engines whose /metrics the counters are summed over (replicas behind a "
        "router, --metrics-url); empty: the target's own /metrics",
    )
    sampling: Sampling = Field(
        default_factory=Sampling.recorded_before_sampling,
        description="how the target sampled the requests (absent in results written before it "
        "was recorded: they were all greedy, to max_tokens)",
    )

    def requests_in_run(self, repeat: int) -> int | None:
        """Requests of run `repeat` (0-based): --num-prompts spread over the runs, the first
        runs one more when it does not divide; else --num-requests; None: by duration."""
        if self.total_requests is None:
            return self.num_requests
        share, extra = divmod(self.total_requests, self.repeats)
        return share + (1 if repeat < extra else 0)

    def length_described(self) -> str:
        """How long each run is, in words: `32 requests per run`."""
        if self.total_requests is not None:
            return f"{self.total_requests} requests per level over its runs"
        if self.num_requests is not None:
            return f"{self.num_requests} requests per run"
        return f"{self.duration_s or 0:g} s of arrivals per run"

    def random_shape(self) -> RandomShape:
        return RandomShape(
            input_len=self.input_len,
            output_len=self.output_len if self.prompt_set == "random" else None,
            input_ratio=self.input_range_ratio,
            output_ratio=self.output_range_ratio,
            prefix_len=self.prefix_len,
        )

    def workload(self) -> dict[str, str]:
        """What the figures depend on besides the server: the requests and their sampling, by
        name, as a reader compares them."""
        dataset = self.prompt_set + (f" ({self.dataset_path})" if self.dataset_path else "")
        if self.dataset_category:
            dataset += f", category {self.dataset_category}"
        length = f"{self.input_len} {self.input_unit}"
        if self.input_range_ratio:
            length += f" +-{self.input_range_ratio:g}"
        if self.prefix_len:
            length += f" after a {self.prefix_len}-token prefix"
        output = str(self.max_tokens) if self.output_len is None else str(self.output_len)
        if self.output_len is not None and self.output_range_ratio:
            output += f" +-{self.output_range_ratio:g}"
        described = {
            "dataset": dataset,
            "input length": length,
            "max tokens": output,
            "prefix groups": str(self.prefix_groups),
            "dataset seed": str(self.seed),
            "sampling": self.sampling.describe(),
        }
        if self.endpoint != "/v1/chat/completions":
            described["endpoint"] = self.endpoint  # (chat, the default, named only when not)
        return described


def requests_described(workload: dict[str, str]) -> str:
    """The requests of a workload (BenchSettings.workload) in one line, its sampling left out:
    `dataset fixed, input length 256, ...`."""
    return ", ".join(f"{name} {value}" for name, value in workload.items() if name != "sampling")


class BenchResult(BaseModel):
    base_url: str
    model: str
    started_at: str
    finished_at: str | None = None
    status: RunStatus = "complete"
    stop_reason: str | None = Field(
        default=None, description="why the run ended before its last level, if it did"
    )
    settings: BenchSettings
    levels: list[LevelResult]
    kv_cache_tokens: int | None = Field(description="num_gpu_blocks x block_size, if reported")
    notes: list[str] = Field(default_factory=list)
    lossless: LosslessCheck | None = None
    sampled_lossless: list[SampledLosslessCheck] | None = None
    pid: int | None = Field(default=None, description="the process writing it, while it runs")
    host: str | None = Field(default=None, description="the machine that process runs on")
