"""The step-cost model's predictions and the schedule they recommend, at their boundaries."""

from __future__ import annotations

import itertools

import pytest
from dflash_sidecar.acceptance_window import acceptance_length_at
from dflash_sidecar.schedule_form import OPEN_END, k_at, short_form
from dflash_sidecar.step_cost import (
    StepCostModel,
    best_k,
    expected_tokens_per_s,
    recommended_ranges,
)
from hypothesis import given
from hypothesis import strategies as st

# A step of 20 ms, 0.5 ms per request, 0.2 ms per verified draft token, a 6 ms drafter pass.
MODEL = StepCostModel(
    base_s=0.020, per_request_s=0.0005, per_draft_token_s=0.0002, drafting_s=0.006,
    fit_error_rms=0.02, fit_error_max=0.05, points=12, max_batch=64,
)  # fmt: skip
GOOD = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3]


def test_throughput_by_hand() -> None:
    # b=1, k=2: tau = 2.7, T = 20 + 0.5 + 0.4 + 6 = 26.9 ms.
    assert MODEL.tokens_per_s(1, 2, GOOD) == pytest.approx(2.7 / 0.0269)
    # k=0 runs no drafter: 2 / 21 ms.
    assert MODEL.tokens_per_s(2, 0, GOOD) == pytest.approx(2 / 0.021)
    assert acceptance_length_at(GOOD, 0) == 1 and acceptance_length_at(GOOD, 3) == pytest.approx(
        3.4
    )


def test_good_acceptance_drafts_long_at_low_batch_and_stops_when_the_batch_fills() -> None:
    ranges = recommended_ranges(MODEL, GOOD, range(8), 256)
    assert ranges[0][0] == 1 and ranges[0][2] == 7
    assert ranges[-1][1] == OPEN_END
    assert [k for _, _, k in ranges] == sorted((k for _, _, k in ranges), reverse=True)
    # Contiguous, covering every batch size once.
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(ranges))


def test_no_acceptance_recommends_off_everywhere() -> None:
    ranges = recommended_ranges(MODEL, [0.0] * 7, range(8), 64)
    assert ranges == ((1, OPEN_END, 0),)
    assert short_form(ranges) == "1-:0"


def test_a_tie_takes_the_smaller_k() -> None:
    flat = StepCostModel(
        base_s=0.01, per_request_s=0.0, per_draft_token_s=0.0, drafting_s=0.0,
        fit_error_rms=0, fit_error_max=0, points=2, max_batch=1,
    )  # fmt: skip
    # Positions past the third accept nothing: k 3..7 predict the same throughput.
    assert best_k(flat, 1, [0.5, 0.5, 0.5, 0, 0, 0, 0], range(8)) == 3


def test_k_at_and_the_expected_throughput_weigh_time_shares() -> None:
    ranges = ((1, 4, 7), (5, OPEN_END, 0))
    assert [k_at(ranges, b, 15) for b in (1, 4, 5, 10**6)] == [7, 7, 0, 0]
    one = expected_tokens_per_s(MODEL, ranges, GOOD, {1: 1.0})
    assert one == pytest.approx(MODEL.tokens_per_s(1, 7, GOOD))
    mixed = expected_tokens_per_s(MODEL, ranges, GOOD, {1: 3.0, 8: 1.0})
    assert mixed == pytest.approx(
        (3 * MODEL.tokens_per_s(1, 7, GOOD) + MODEL.tokens_per_s(8, 0, GOOD)) / 4
    )
    assert expected_tokens_per_s(MODEL, ranges, GOOD, {}) == 0.0


@given(
    per_position=st.lists(st.floats(0, 1), min_size=7, max_size=7),
    largest=st.integers(1, 300),
    batch=st.integers(1, 300),
)
def test_the_recommended_schedule_is_never_predicted_slower_than_a_static_k(
    per_position: list[float], largest: int, batch: int
) -> None:
    ranges = recommended_ranges(MODEL, per_position, range(8), largest)
    ours = expected_tokens_per_s(MODEL, ranges, per_position, {batch: 1.0})
    for k in range(8):
        static = ((1, OPEN_END, k),)
        theirs = expected_tokens_per_s(MODEL, static, per_position, {batch: 1.0})
        assert ours >= theirs * (1 - 1e-9) or batch > largest
