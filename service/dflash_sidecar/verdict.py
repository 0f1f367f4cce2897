"""A verdict on the acceptance curve: healthy smooth decay, degraded, or collapsed.

Wrong captured target features (the failure the patch series fixes) show as a mean acceptance
length near 1 and almost nothing accepted at position 0. The thresholds are settings; the
defaults suit a trained draft such as DFlash2 (mean acceptance length about 4 at block 8).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Verdict(StrEnum):
    NO_DATA = "no-data"
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    COLLAPSED = "collapsed"


VERDICT_CODES = {Verdict.NO_DATA: -1, Verdict.HEALTHY: 0, Verdict.DEGRADED: 1, Verdict.COLLAPSED: 2}


class VerdictThresholds(BaseModel):
    model_config = ConfigDict(frozen=True, allow_inf_nan=False)

    min_drafts: int = Field(
        default=20, ge=1, description="fewer drafts in the window than this: no-data"
    )
    collapsed_mean_acceptance_length: float = Field(
        default=1.2, gt=1.0, description="below this: collapsed"
    )
    collapsed_position0: float = Field(
        default=0.1, ge=0.0, le=1.0, description="position-0 acceptance below this: collapsed"
    )
    degraded_mean_acceptance_length: float = Field(
        default=2.0, gt=1.0, description="below this: degraded"
    )
    degraded_position0: float = Field(
        default=0.4, ge=0.0, le=1.0, description="position-0 acceptance below this: degraded"
    )

    @model_validator(mode="after")
    def _ordered(self) -> VerdictThresholds:
        if self.collapsed_mean_acceptance_length > self.degraded_mean_acceptance_length:
            raise ValueError(
                "collapsed_mean_acceptance_length must not exceed degraded_mean_acceptance_length"
            )
        if self.collapsed_position0 > self.degraded_position0:
            raise ValueError("collapsed_position0 must not exceed degraded_position0")
        return self


# Below this share of num_speculative_tokens drafted per draft, k was lowered in the window
# (a static k drafts exactly k per draft; counter skew between scrapes is far smaller).
LOWERED = 0.95


def allowed_share(k_in_effect: float | None, k_max: int | None) -> float:
    """How much of the largest k was in effect (at most 1; 1 when either is unknown). The
    collapse alert scales its threshold by the same share (dflash:spec_decode_k_in_effect)."""
    if k_in_effect is None or not k_max:
        return 1.0
    return min(1.0, max(k_in_effect, 0.0) / k_max)


def k_lowered(k_in_effect: float | None, k_max: int | None) -> bool:
    """A k schedule lowered k in the window: drafted tokens per draft clearly below the largest
    k (a static k drafts exactly k per draft; counter skew between scrapes is far smaller)."""
    return allowed_share(k_in_effect, k_max) < LOWERED


def judge(
    drafts: float,
    mean_acceptance_length: float | None,
    per_position: list[float],
    thresholds: VerdictThresholds,
    k_in_effect: float | None = None,
    k_max: int | None = None,
) -> tuple[Verdict, str]:
    """The verdict and a one-line reason. Position 0 is drafted at any k > 0 and is judged as
    it is; where a k schedule lowered k (`k_in_effect` below `k_max`), the mean acceptance
    length is judged against what that k allows: each threshold's gain over 1 scaled by the
    share of the largest k in effect."""
    if drafts < thresholds.min_drafts or mean_acceptance_length is None:
        return Verdict.NO_DATA, f"{drafts:.0f} drafts in the window (< {thresholds.min_drafts})"
    share = allowed_share(k_in_effect, k_max)
    collapsed_mal = 1 + (thresholds.collapsed_mean_acceptance_length - 1) * share
    degraded_mal = 1 + (thresholds.degraded_mean_acceptance_length - 1) * share
    # Without per-position lines (a partial page) the verdict rests on the mean alone.
    position0 = per_position[0] if per_position else None
    summary = f"mean acceptance length {mean_acceptance_length:.2f}, " + (
        f"position 0 {position0:.2f}" if position0 is not None else "no per-position figures"
    )
    if k_lowered(k_in_effect, k_max):
        summary += f" (k {k_in_effect:.2f} in effect of {k_max}: thresholds scaled by {share:.2f})"
    if mean_acceptance_length < collapsed_mal or (
        position0 is not None and position0 < thresholds.collapsed_position0
    ):
        return Verdict.COLLAPSED, f"{summary}: the draft is almost never accepted"
    if mean_acceptance_length < degraded_mal or (
        position0 is not None and position0 < thresholds.degraded_position0
    ):
        return Verdict.DEGRADED, f"{summary}: below the degraded thresholds"
    return Verdict.HEALTHY, summary
