from __future__ import annotations

import pytest
from dflash_sidecar.verdict import Verdict, VerdictThresholds, judge
from pydantic import ValidationError

T = VerdictThresholds()


@pytest.mark.parametrize(
    ("drafts", "mal", "per_pos", "verdict"),
    [
        (1000, 4.08, [0.9, 0.8, 0.6, 0.4, 0.2, 0.1, 0.05], Verdict.HEALTHY),
        (1000, 1.6, [0.5, 0.1], Verdict.DEGRADED),
        (1000, 3.0, [0.3, 0.9, 0.9], Verdict.DEGRADED),  # a position-0 drop
        (1000, 1.05, [0.04, 0.01], Verdict.COLLAPSED),
        (1000, 2.5, [0.05, 0.9], Verdict.COLLAPSED),  # cliff at position 0
        (5, 4.0, [0.9], Verdict.NO_DATA),
        (1000, None, [], Verdict.NO_DATA),
    ],
)
def test_verdicts(drafts: float, mal: float | None, per_pos: list[float], verdict: Verdict) -> None:
    assert judge(drafts, mal, per_pos, T)[0] == verdict


def test_thresholds_must_be_ordered() -> None:
    with pytest.raises(ValidationError, match="must not exceed"):
        VerdictThresholds(collapsed_mean_acceptance_length=3.0, degraded_mean_acceptance_length=2.0)
