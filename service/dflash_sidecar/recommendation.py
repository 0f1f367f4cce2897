"""The k schedule the live traffic asks for: the step-cost model of the deployment (fitted by
`bench sweep`, carried in the baseline), the per-position acceptance the engine reads now, and
how long the engine ran each batch size. Served at GET /recommendation and exported as
`dflash_schedule_*` series.

The step cost comes from a sweep, run on another day, perhaps on another node or with other
prompts; the window says how fast the engine really ran: its output tokens/s while it generated,
over the step cost's prediction for the running schedule at the same batch sizes and acceptance
(the step cost's ratio). Within STEP_COST_DRIFT of 1 that is the step cost's own run-to-run
variation and the predictions stay the step cost's; beyond it the step cost has drifted
(another machine, day or traffic), every prediction is scaled by the ratio, so that it speaks for
the minutes the traffic ran, and the advice says to refit. The gain, a ratio, never moves.

It says which figures it used, over which window, and why it recommends nothing when it cannot:
no step-cost model, too few drafts or batch samples, or per-position acceptance measured below
the largest k (a schedule lowered k in the window: only position 0 is then known).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field

from dflash_sidecar.acceptance_window import Delta
from dflash_sidecar.schedule_form import OPEN_END, Schedule, short_form
from dflash_sidecar.step_cost import StepCostModel, expected_tokens_per_s, recommended_ranges

# A change is recommended when it is predicted this much faster than what runs.
MIN_GAIN = 0.05
MIN_DRAFTS = 200.0
MIN_BATCH_SAMPLES = 30
# Under a k schedule, a position's acceptance needs this many drafts that reached it.
MIN_POSITION_DRAFTS = 50.0
# A scrape interval whose drafted tokens per draft is this close to a whole k ran at that k.
WHOLE_K = 0.05
# The engine's measured speed over the step cost's prediction for what runs, beyond which the step
# cost has drifted: the predictions are scaled to the engine and the advice says to refit. Within
# it, the step cost's own run-to-run variation: on the paying CPU pair (2026-12-08) one engine
# start ran at 0.88x to 1.17x of a step cost fitted minutes earlier, and scaling by it moved
# every other k's error by as much (docs/choosing-k.md); a step cost fitted on the morning ran
# 31-39% high that evening. Where engine starts vary less (GPUs), a smaller drift is real.
STEP_COST_DRIFT = 0.25


def busy_tokens_per_s(intervals_by_series: Iterable[Sequence[Delta]]) -> tuple[float | None, int]:
    """The engine's output tokens/s while it generated: for each series, the generation tokens
    of its scrape intervals that generated any, over those intervals' seconds; summed over the
    series (engines run side by side). With the number of such intervals (of the series that
    had the most); None when no interval generated."""
    rate, most = 0.0, 0
    for intervals in intervals_by_series:
        busy = [d for d in intervals if d.generation_tokens > 0 and d.seconds > 0]
        if busy:
            rate += sum(d.generation_tokens for d in busy) / sum(d.seconds for d in busy)
            most = max(most, len(busy))
    return (rate if most else None), most


def per_position_at_k_in_effect(
    intervals: Iterable[Delta], ks: set[int]
) -> tuple[list[float], list[float]]:
    """Per-position acceptance where a k schedule lowered k: each scrape interval that ran one
    of the schedule's `ks` (drafted tokens per draft within WHOLE_K of it) counts its drafts for
    the positions below that k only; intervals that mixed ks are left out (a mix that averages
    to another of the schedule's ks, k 4 and 2 read as 3, is not told apart). Returns the rates
    of the positions with MIN_POSITION_DRAFTS or more (up to the first without), and the drafts
    that reached each position."""
    accepted: list[float] = []
    reached: list[float] = []
    for delta in intervals:
        if delta.drafts <= 0 or not delta.accepted_per_pos:
            continue
        k_in_effect = delta.draft_tokens / delta.drafts
        k = round(k_in_effect)
        if k not in ks or k < 1 or abs(k_in_effect - k) > WHOLE_K:
            continue
        for i in range(min(k, len(delta.accepted_per_pos))):
            if i == len(reached):
                accepted.append(0.0)
                reached.append(0.0)
            accepted[i] += delta.accepted_per_pos[i]
            reached[i] += delta.drafts
    rates = []
    for hits, drafts in zip(accepted, reached, strict=True):
        if drafts < MIN_POSITION_DRAFTS:
            break
        rates.append(hits / drafts)
    return rates, reached


class RunningBatchSamples:
    """vllm:num_requests_running at every scrape, over the longest window; idle scrapes
    (nothing running) are left out: no schedule runs then."""

    def __init__(self, keep_seconds: float) -> None:
        self.keep_seconds = keep_seconds
        self.samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, running: float) -> None:
        if running >= 1:
            self.samples.append((now, round(running)))
        while self.samples and self.samples[0][0] < now - self.keep_seconds:
            self.samples.popleft()

    def share(self, now: float, seconds: float) -> dict[int, int]:
        """Scrapes per batch size over the last `seconds` (scrapes are evenly spaced)."""
        return dict(Counter(b for at, b in self.samples if at >= now - seconds))


class Evidence(BaseModel):
    window: str
    drafts: float
    per_position_acceptance: list[float]
    batch_samples: dict[int, int] = Field(description="scrapes seen at each running batch size")
    step_cost: StepCostModel | None
    measured_on: str = Field(description="the sampling and workload the step cost came from")
    position_drafts: list[float] | None = Field(
        default=None,
        description="where a schedule lowered k: the drafts that reached each position, from "
        "the scrape intervals that ran one k (per_position_at_k_in_effect)",
    )
    measured_tokens_per_s: float | None = Field(
        default=None,
        description="output tokens/s over the window's scrape intervals that generated "
        "(busy_tokens_per_s)",
    )
    step_cost_ratio: float | None = Field(
        default=None,
        description="measured_tokens_per_s over the step cost's prediction for the running "
        "schedule (None: too few busy intervals)",
    )
    scaled: bool = Field(
        default=False,
        description=f"the ratio is beyond 1 +/- {STEP_COST_DRIFT}: every predicted tokens/s "
        "is multiplied by it",
    )


class Recommendation(BaseModel):
    model_config = ConfigDict(frozen=True)

    available: bool
    recommended: bool = Field(description=f"predicted at least {MIN_GAIN:.0%} faster")
    reason: str
    running: str = Field(description="the schedule in effect, in the short form")
    schedule: str | None = Field(description="the schedule predicted fastest, in the short form")
    chart_values: dict[str, object] | None = Field(
        description="the chart's values for it (helm upgrade -f)"
    )
    predicted_gain: float | None = Field(description="recommended over running, minus 1")
    predicted_tokens_per_s: dict[str, float] | None
    predicted_tokens_per_s_by_k: dict[int, float] | None = Field(
        default=None,
        description="every static k (0: speculation off) at the batch sizes the window ran",
    )
    evidence: Evidence


def recommend(
    step_cost: StepCostModel | None,
    per_position: list[float],
    drafts: float,
    largest_k: int,
    batch_samples: dict[int, int],
    window: str,
    measured_on: str = "",
    running_schedule: Schedule | None = None,
    position_drafts: list[float] | None = None,
    busy: tuple[float | None, int] = (None, 0),
) -> Recommendation:
    """`running_schedule`: the engine's k schedule, if it runs one (else its largest k);
    `position_drafts`: where per_position came from the intervals at each k in effect;
    `busy`: the window's busy_tokens_per_s, against which the step cost is judged (and the
    predictions scaled, beyond STEP_COST_DRIFT) when it has MIN_BATCH_SAMPLES intervals."""
    running: Schedule = running_schedule or ((1, OPEN_END, largest_k),)
    evidence = Evidence(
        window=window,
        drafts=drafts,
        per_position_acceptance=per_position,
        batch_samples=batch_samples,
        step_cost=step_cost,
        measured_on=measured_on,
        position_drafts=position_drafts,
    )

    def none(reason: str) -> Recommendation:
        return Recommendation(
            available=False, recommended=False, reason=reason, running=short_form(running),
            schedule=None, chart_values=None, predicted_gain=None, predicted_tokens_per_s=None,
            predicted_tokens_per_s_by_k=None, evidence=evidence,
        )  # fmt: skip

    if step_cost is None:
        return none(
            "no step-cost model: give the sidecar bench sweep's baseline (sidecar.baseline, "
            "local up --baseline), which carries it"
        )
    if largest_k < 1:
        return none("speculation is off: there is no k to schedule")
    if drafts < MIN_DRAFTS:
        return none(f"{drafts:.0f} drafts in the {window} window; waiting for {MIN_DRAFTS:.0f}")
    if len(per_position) < largest_k:
        known = len(per_position)
        reached = (
            f" (position {known + 1} was reached by "
            f"{position_drafts[known] if len(position_drafts) > known else 0:.0f} drafts of the "
            f"scrape intervals that ran one k; {MIN_POSITION_DRAFTS:.0f} needed)"
            if position_drafts is not None
            else ""
        )
        return none(
            f"per-position acceptance is known up to position {len(per_position)} of "
            f"{largest_k}: a schedule lowered k in the {window} window{reached}"
        )
    samples = sum(batch_samples.values())
    if samples < MIN_BATCH_SAMPLES:
        return none(
            f"{samples} scrapes with requests running in the {window} window; waiting for "
            f"{MIN_BATCH_SAMPLES}"
        )
    # A schedule's ranges draft at least one token: at k 0 inside a schedule the draft model
    # still runs (vLLM's draft_model path keeps its KV cache; measured 19% slower than off on
    # the paying pair, docs/choosing-k.md), which the step-cost model does not price. Off is
    # recommended whole, where it beats every schedule.
    by_k = {
        k: expected_tokens_per_s(step_cost, ((1, OPEN_END, k),), per_position, batch_samples)
        for k in range(largest_k + 1)
    }
    ranges = recommended_ranges(
        step_cost, per_position, range(1, largest_k + 1), max(batch_samples)
    )
    ours = expected_tokens_per_s(step_cost, ranges, per_position, batch_samples)
    off: Schedule = ((1, OPEN_END, 0),)
    if by_k[0] > ours:
        ranges, ours = off, by_k[0]
    theirs = expected_tokens_per_s(step_cost, running, per_position, batch_samples)
    gain = ours / theirs - 1 if theirs > 0 else 0.0
    measured, busy_intervals = busy
    ratio = None
    if measured is not None and busy_intervals >= MIN_BATCH_SAMPLES and theirs > 0:
        ratio = measured / theirs
    drifted = ratio is not None and abs(ratio - 1) > STEP_COST_DRIFT
    if ratio is not None and drifted:
        by_k = {k: v * ratio for k, v in by_k.items()}
        ours, theirs = ours * ratio, theirs * ratio
    evidence = evidence.model_copy(
        update={"measured_tokens_per_s": measured, "step_cost_ratio": ratio, "scaled": drifted}
    )
    text = short_form(ranges)
    static = len(ranges) == 1
    speculative: dict[str, object] = (
        {"method": "off"}
        if static and ranges[0][2] == 0
        else {
            "numSpeculativeTokens": max(k for _, _, k in ranges),
            "schedule": "" if static else text,
        }
    )
    recommended = gain >= MIN_GAIN
    return Recommendation(
        available=True,
        recommended=recommended,
        reason=(
            f"predicted {gain:+.1%} over {short_form(running)} at the batch sizes the {window} "
            f"window ran"
            + ("" if recommended else f": below the {MIN_GAIN:.0%} a change needs")
            + (
                "; off's throughput is the step cost's alone (a speculating engine never runs "
                "it, so no live figure checks it): verify with bench sweep before turning it off"
                if ranges == off
                else ""
            )
            + (
                f"; the engine ran at {ratio:.2f}x the step cost's prediction for "
                f"{short_form(running)} (every prediction is scaled to it): the sweep it came "
                f"from measured another machine, load or sampling ({measured_on or 'unsaid'}); "
                "refit it with bench sweep on this traffic"
                if ratio is not None and drifted
                else ""
            )
        ),
        running=short_form(running),
        schedule=text,
        chart_values={"speculative": speculative},
        predicted_gain=gain,
        predicted_tokens_per_s={"running": theirs, "recommended": ours},
        predicted_tokens_per_s_by_k=by_k,
        evidence=evidence,
    )
