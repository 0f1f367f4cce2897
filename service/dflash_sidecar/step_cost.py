"""The deployment's step cost, and the k schedule live traffic asks for.

An engine step advances every running request: with b requests running and k draft tokens each,
a step takes T(b, k) seconds and each request gains, on average, its mean acceptance length
tau(k) = 1 + the first k per-position acceptance rates (a position's acceptance does not depend
on how many follow it). Output throughput is then b * tau(k) / T(b, k).

T is fitted once, by `bench sweep`, from its own measurements (every setting at every load:
running batch, k, mean acceptance length, output tokens/s), as

    T(b, k) = base + per_request * b + per_draft_token * b * k + drafting * [k > 0]

(a step's fixed cost, each request's decode, each verified draft token, the drafter's pass), and
carried with its fit error beside the sweep's baseline. Acceptance is what changes with the
traffic: the sidecar reads it live, with the running-batch distribution, and predicts the
throughput of every k at every batch size; the schedule that maximizes it, and the predicted gain
over the schedule running, are the recommendation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from dflash_sidecar.acceptance_window import acceptance_length_at
from dflash_sidecar.schedule_form import OPEN_END, Schedule, k_at


class StepCostModel(BaseModel):
    """T(b, k) in seconds, fitted from a sweep, with how well it fits that sweep."""

    model_config = ConfigDict(frozen=True, allow_inf_nan=False, extra="forbid")

    base_s: float
    per_request_s: float
    per_draft_token_s: float
    drafting_s: float
    fit_error_rms: float = Field(ge=0, description="relative error of the fitted throughput")
    fit_error_max: float = Field(ge=0)
    points: int = Field(ge=1, description="sweep measurements it was fitted on")
    max_batch: float = Field(gt=0, description="the largest running batch measured")

    def step_seconds(self, batch: float, k: int) -> float:
        t = (
            self.base_s
            + self.per_request_s * batch
            + self.per_draft_token_s * batch * k
            + (self.drafting_s if k > 0 else 0.0)
        )
        return max(t, 1e-9)

    def tokens_per_s(self, batch: float, k: int, per_position: Sequence[float]) -> float:
        return batch * acceptance_length_at(per_position, k) / self.step_seconds(batch, k)


def best_k(
    model: StepCostModel, batch: int, per_position: Sequence[float], ks: Sequence[int]
) -> int:
    """The k of `ks` with the highest predicted throughput at this batch; the smaller on a tie."""
    return max(sorted(ks), key=lambda k: (model.tokens_per_s(batch, k, per_position), -k))


def recommended_ranges(
    model: StepCostModel, per_position: Sequence[float], ks: Sequence[int], largest_batch: int
) -> Schedule:
    """The best k at every batch size 1..largest_batch, as ranges (the last one open)."""
    ranges: list[tuple[int, int, int]] = []
    for batch in range(1, max(largest_batch, 1) + 1):
        k = best_k(model, batch, per_position, ks)
        if ranges and ranges[-1][2] == k:
            ranges[-1] = (ranges[-1][0], batch, k)
        else:
            ranges.append((batch, batch, k))
    first, _, k = ranges[-1]
    ranges[-1] = (first, OPEN_END, k)
    return tuple(ranges)


def expected_tokens_per_s(
    model: StepCostModel,
    ranges: Schedule,
    per_position: Sequence[float],
    batch_share: Mapping[int, float],
) -> float:
    """Throughput over time under this schedule: each batch size's predicted throughput,
    weighted by the share of time the engine ran that batch."""
    total = sum(batch_share.values())
    if total <= 0:
        return 0.0
    return (
        sum(
            share * model.tokens_per_s(batch, k_at(ranges, batch, OPEN_END), per_position)
            for batch, share in batch_share.items()
        )
        / total
    )
