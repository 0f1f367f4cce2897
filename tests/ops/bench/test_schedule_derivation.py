"""A k schedule derived from a sweep's measurements (bench/sweep/schedule_derivation.py): ranges
of the running batch around the measured levels, checked with vLLM's lookup semantics
(speculative_schedule.k_at, held to vLLM 0.33.0's scheduler by its own tests)."""

from __future__ import annotations

import itertools
import math

import pytest
from dflash_ops.bench.core.results import BenchResult, RunningBatch
from dflash_ops.bench.sweep.analysis import analyse
from dflash_ops.bench.sweep.deployers import Setting
from dflash_ops.bench.sweep.schedule_derivation import (
    DerivedSchedule,
    NoSchedule,
    derive_schedule,
    schedule_of,
)
from dflash_ops.speculative_schedule import OPEN_END, k_at, parse_schedule
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.ops.bench.test_sweep import CURVE, level, result


def test_each_measured_batch_gets_its_levels_k_and_boundaries_sit_between() -> None:
    assert schedule_of([(1.0, 4), (3.9, 3), (15.6, 0)]) == ((1, 2, 4), (3, 8, 3), (9, OPEN_END, 0))
    # Neighbours with one k merge; one point is one open range.
    assert schedule_of([(1, 4), (4, 4), (16, 1)]) == ((1, 8, 4), (9, OPEN_END, 1))
    assert schedule_of([(7.2, 2)]) == ((1, OPEN_END, 2),)
    # Two levels at the same whole batch: the smaller k (equal speed, fewer KV blocks).
    assert schedule_of([(2.2, 5), (1.8, 3), (8, 1)]) == ((1, 4, 3), (5, OPEN_END, 1))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.5, 5000, allow_nan=False), st.integers(0, 15)),
        min_size=1,
        max_size=8,
    )
)
def test_any_measurement_gives_a_schedule_vllm_accepts_with_the_nearest_levels_k(
    points: list[tuple[float, int]],
) -> None:
    ranges = schedule_of(points)
    largest = max(k for _, _, k in ranges)
    text = ",".join(f"{a}-{'' if b == OPEN_END else b}:{k}" for a, b, k in ranges)
    assert parse_schedule(text, max(largest, 1)) == ranges  # what the chart and vLLM accept
    assert ranges[0][0] == 1 and ranges[-1][1] == OPEN_END
    assert all(b + 1 == a for (_, b, _), (a, _, _) in itertools.pairwise(ranges))
    wanted: dict[int, int] = {}
    for batch, k in points:
        whole = max(1, round(batch))
        wanted[whole] = min(k, wanted.get(whole, k))
    for whole, k in wanted.items():
        assert k_at(ranges, whole, 15) == k, (whole, ranges)
    # Between two measured batches, the nearer one on a log scale decides.
    ordered = sorted(wanted)
    for low, high in itertools.pairwise(ordered):
        for batch in (low + 1, high - 1):
            if low < batch < high:
                nearer = low if math.log(batch / low) < math.log(high / batch) else high
                if not math.isclose(math.log(batch / low), math.log(high / batch), abs_tol=0.1):
                    assert k_at(ranges, batch, 15) == wanted[nearer], (batch, ranges)


def measured(concurrency: int, tps: float, k: int, batch: float | None) -> tuple[int, object]:
    lv = level(concurrency, tps, 1.0, 30.0, CURVE[:k] if k else [])
    if batch is not None:
        lv.running_batch = RunningBatch(mean=batch, p50=batch, p90=batch, max=batch, samples=9)
    return concurrency, lv


def sweep_results(
    table: dict[int, dict[int, tuple[float, float | None]]],
) -> dict[Setting, BenchResult]:
    """{k: {concurrency: (tok/s, running batch)}} as the sweep's results."""
    out = {}
    for k, levels in table.items():
        out[Setting(k, "draft_model")] = result(
            *(measured(c, tps, k, batch)[1] for c, (tps, batch) in sorted(levels.items()))  # type: ignore[misc]
        )
    return out


def test_the_sweep_picks_make_the_schedule_at_the_measured_batches() -> None:
    results = sweep_results({
        0: {1: (20, 1.0), 4: (80, 3.8), 16: (300, 14.5)},
        2: {1: (40, 1.0), 4: (140, 3.9), 16: (390, 15.2)},
        4: {1: (46, 1.0), 4: (130, 3.9), 16: (350, 15.0)},
    })  # fmt: skip
    derived = derive_schedule(analyse(results, with_capacity=False), results)
    assert isinstance(derived, DerivedSchedule)
    assert [(p.level, p.k, p.running_batch) for p in derived.picks] == [
        ("concurrency 1", 4, 1.0), ("concurrency 4", 2, 3.9), ("concurrency 16", 2, 15.2),
    ]  # fmt: skip
    assert derived.short_form == "1-2:4,3-:2" and derived.largest_k == 4
    assert derived.method == "draft_model"


@pytest.mark.parametrize(
    ("table", "reason"),
    [
        ({0: {1: (50, 1.0)}, 2: {1: (40, 1.0)}}, "every level recommends off"),
        ({0: {1: (20, 1.0), 4: (80, 4.0)}, 2: {1: (40, 1.0), 4: (140, 4.0)}}, "one static k"),
        ({0: {1: (20, None)}, 2: {1: (40, None)}}, "no running batch was measured"),
    ],
    ids=["all-off", "static", "no-gauge"],
)
def test_no_schedule_says_why(
    table: dict[int, dict[int, tuple[float, float | None]]], reason: str
) -> None:
    results = sweep_results(table)
    derived = derive_schedule(analyse(results, with_capacity=False), results)
    assert isinstance(derived, NoSchedule) and reason in derived.reason


def test_where_off_wins_the_schedule_takes_the_best_speculative_k_and_says_so() -> None:
    # At 64 running, off is fastest; k 2 is close behind and k 4 far behind. A k of 0 in a
    # schedule would keep the draft model's cost, so the derivation takes k 2 there.
    results = sweep_results({
        0: {1: (22, 1.0), 64: (720, 60.0)},
        2: {1: (40, 1.0), 64: (700, 61.0)},
        4: {1: (46, 1.0), 64: (600, 59.0)},
    })  # fmt: skip
    analysis = analyse(results, with_capacity=False)
    assert [r.recommended for r in analysis.recommendations] == ["draft_model-k4", "off"]
    derived = derive_schedule(analysis, results)
    assert isinstance(derived, DerivedSchedule)
    assert derived.short_form == "1-7:4,8-:2"
    assert [(o.level, o.best_speculative, round(o.ratio, 3)) for o in derived.off_ahead] == [
        ("concurrency 64", "draft_model-k2", round(700 / 720, 3))
    ]
    assert "concurrency 64: off recommended (draft_model-k2 0.97x of it)" in derived.describe()


def test_one_speculative_k_everywhere_is_no_schedule_even_where_off_wins() -> None:
    results = sweep_results({0: {1: (22, 1.0), 64: (720, 60.0)}, 4: {1: (46, 1.0), 64: (600, 59)}})
    derived = derive_schedule(analyse(results, with_capacity=False), results)
    assert isinstance(derived, NoSchedule)
    assert "one static k" in derived.reason and derived.off_ahead[0].level == "concurrency 64"
    assert "0.83x" in derived.describe()
