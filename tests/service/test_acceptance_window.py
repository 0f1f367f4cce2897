from __future__ import annotations

import math

import pytest
from dflash_sidecar import metrics_parser
from dflash_sidecar.acceptance_window import (
    RESTART_AFTER_INCONSISTENT,
    AcceptanceWindow,
    SampleProblem,
    Snapshot,
    impossible_figures,
)

from tests.service.conftest import raw_counter
from tests.service.fake_engine import Counters, vllm_page

KEY = (("engine", "0"), ("model_name", "tiny"))
STALE = 10.0


def snap(
    at: float, drafts: float, accepted: float, per_pos: tuple[float, ...], gen: float
) -> Snapshot:
    return Snapshot(
        at=at,
        drafts=drafts,
        draft_tokens=drafts * len(per_pos),
        accepted=accepted,
        accepted_per_pos=per_pos,
        generation_tokens=gen,
    )


def snapshot_of(text: str, at: float) -> Snapshot:
    made = Snapshot.of(at, metrics_parser.parse(text).series[KEY])
    assert isinstance(made, Snapshot), made
    return made


def test_delta_between_the_two_recorded_expositions(before_text: str, after_text: str) -> None:
    window = AcceptanceWindow(capacity=10)
    window.add(snapshot_of(before_text, 100.0))
    window.add(snapshot_of(after_text, 130.0))
    delta = window.delta(60, now=130.0, stale_after=STALE)
    assert delta is not None and delta.seconds == 30.0
    name = "vllm:spec_decode_num_drafts_total"
    assert delta.drafts == raw_counter(after_text, name) - raw_counter(before_text, name)
    name = "vllm:generation_tokens_total"
    assert delta.generation_tokens == raw_counter(after_text, name) - raw_counter(before_text, name)
    assert delta.impossible() is None


def test_window_only_spans_its_length() -> None:
    window = AcceptanceWindow(capacity=100)
    for t in range(0, 121, 2):
        window.add(
            snap(float(t), drafts=t * 10, accepted=t * 5, per_pos=(t * 3, t * 2), gen=t * 20)
        )
    delta = window.delta(60, now=120.0, stale_after=STALE)
    assert delta is not None
    assert delta.seconds == 60 and delta.drafts == 600 and delta.accepted_per_pos == (180, 120)


def test_windows_end_now_so_a_gone_engine_has_no_figures() -> None:
    window = AcceptanceWindow(capacity=100)
    for t in range(0, 61, 2):
        window.add(snap(float(t), t * 10, t * 5, (t * 3, t * 2), t * 20))
    assert window.delta(60, now=61.0, stale_after=STALE) is not None
    # 70 s after the last snapshot: the window must not describe the dead engine as serving.
    assert window.delta(60, now=130.0, stale_after=STALE) is None
    assert window.delta(900, now=130.0, stale_after=STALE) is None


def test_engine_restart_restarts_the_window_without_negative_rates() -> None:
    window = AcceptanceWindow(capacity=100)
    window.add(snap(0, 1000, 500, (300, 200), 5000))
    window.add(snap(2, 1010, 505, (303, 202), 5050))
    assert window.add(snap(4, 3, 1, (1, 0), 10)) is True  # generation went back: restart
    assert window.resets == 1 and len(window) == 1
    assert window.delta(60, now=4.0, stale_after=STALE) is None
    window.add(snap(6, 13, 6, (4, 2), 60))
    delta = window.delta(60, now=6.0, stale_after=STALE)
    assert delta is not None
    assert all(
        v >= 0 and not math.isnan(v)
        for v in (delta.drafts, delta.accepted, delta.generation_tokens)
    )


def test_one_counter_going_back_without_a_restart_is_dropped_not_a_reset() -> None:
    window = AcceptanceWindow(capacity=100)
    window.add(snap(0, 1000, 500, (300, 200), 5000))
    lying = snap(2, 1010, 20, (300, 200), 5050)  # accepted went back, generation did not
    assert window.add(lying) is SampleProblem.INCONSISTENT
    assert window.resets == 0 and len(window) == 1
    window.add(snap(4, 1020, 510, (306, 204), 5100))
    delta = window.delta(60, now=4.0, stale_after=STALE)
    assert delta is not None and (delta.drafts, delta.accepted) == (20, 10)


def test_an_inconsistency_that_persists_is_a_restart() -> None:
    window = AcceptanceWindow(capacity=100)
    window.add(snap(0, 1000, 500, (300, 200), 10))
    for i in range(1, RESTART_AFTER_INCONSISTENT):
        assert window.add(snap(2.0 * i, 5 + i, 2, (1, 1), 20 + i)) is SampleProblem.INCONSISTENT
    assert window.add(snap(10, 10, 4, (2, 2), 40)) is True
    assert window.resets == 1 and len(window) == 1


def snap_k(at: float, drafts: float, per_pos: tuple[float, ...], k: int = 2) -> Snapshot:
    """A snapshot of an engine with k draft tokens per draft; `per_pos` may be shorter than k
    (lines missing from the page) or empty."""
    return Snapshot(
        at=at,
        drafts=drafts,
        draft_tokens=drafts * k,
        accepted=sum(per_pos) if len(per_pos) == k else drafts * 0.9,
        accepted_per_pos=per_pos,
        generation_tokens=drafts * 3,
    )


def test_per_position_lines_that_vanish_and_return_shorten_their_span_not_the_window() -> None:
    window = AcceptanceWindow(capacity=20)
    assert window.add(snap_k(0, 0, (0, 0))) is False
    assert window.add(snap_k(2, 10, (6, 3))) is False
    # A partial page: the per-position lines are missing (an 8 s glitch, say).
    assert window.add(snap_k(4, 20, ())) is False
    during = window.delta(60, now=4, stale_after=STALE)
    assert during is not None and during.drafts == 20 and during.per_position() == []
    assert during.impossible() is None  # judged on what is there: the mean
    # They come back: the per-position figures span the whole window again.
    assert window.add(snap_k(6, 30, (18, 9))) is False
    after = window.delta(60, now=6, stale_after=STALE)
    assert after is not None and after.per_position() == [18 / 30, 9 / 30]
    assert window.resets == 0
    # Only position 0 on the next page: a shorter curve, from the last page that had one line.
    assert window.add(snap_k(8, 40, (24,))) is False
    short = window.delta(60, now=8, stale_after=STALE)
    assert short is not None and short.per_position() == []  # no earlier one-line page yet
    assert window.add(snap_k(10, 50, (30,))) is False
    short = window.delta(60, now=10, stale_after=STALE)
    assert short is not None and short.pos_drafts == 10 and short.per_position() == [0.6]


def test_a_counter_going_back_is_still_inconsistent() -> None:
    window = AcceptanceWindow(capacity=10)
    window.add(snap_k(0, 10, (6, 3)))
    assert window.add(snap_k(2, 20, (12, 6))) is False
    assert window.add(snap_k(4, 20, (11, 6))) is SampleProblem.INCONSISTENT


def first_line(page: str, prefix: str) -> str:
    return next(line for line in page.splitlines() if line.startswith(prefix)) + "\n"


@pytest.mark.parametrize(
    ("page_edit", "problem"),
    [
        (lambda p: p.replace("spec_decode_num_drafts_total{", "x_total{", 1), "incomplete"),
        (lambda p: p + first_line(p, "vllm:spec_decode_num_drafts_total"), "untrusted"),
        (lambda p: p.replace("} 2000.0\n", "} +Inf\n", 1), "untrusted"),
        (lambda p: p.replace("} 500.0\n", "} NaN\n", 1), "untrusted"),
        (
            lambda p: "\n".join(x for x in p.splitlines() if "generation_tokens_total" not in x),
            "incomplete",
        ),
    ],
    ids=["no-drafts", "duplicate", "inf", "nan", "no-generation"],
)
def test_samples_that_cannot_be_trusted_are_refused(page_edit, problem: str) -> None:  # type: ignore[no-untyped-def]
    c = Counters()
    c.step(500, [300, 200, 100, 50])
    page = page_edit(vllm_page(c))
    sample = metrics_parser.parse(page).series[KEY]
    assert Snapshot.of(0.0, sample) == SampleProblem(problem)


@pytest.mark.parametrize(
    ("figures", "why"),
    [
        ((10, 40, 41, [10, 10, 10, 10]), "accepted of"),
        ((10, 40, 12, [11, 1, 0, 0]), "more often than there were drafts"),
        ((10, 50, 20, [10, 5, 5, 0]), "more than 4 draft tokens per draft"),
        ((100, 400, 200, [10, 5, 5, 0]), "sums to"),
        ((10, 40, 10, [5, 3, 2, 0]), None),
    ],
)
def test_impossible_figures_are_named(figures, why: str | None) -> None:  # type: ignore[no-untyped-def]
    reason = impossible_figures(*figures)
    assert (reason is None) if why is None else (why in (reason or ""))


def test_memory_is_bounded() -> None:
    window = AcceptanceWindow(capacity=453)
    for t in range(50_000):
        window.add(snap(t * 2.0, t, t / 2, (t / 2,), t * 3))
    assert len(window) == 453


def test_capacity_must_hold_two_snapshots() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        AcceptanceWindow(capacity=1)


def test_a_page_missing_some_positions_gives_the_curve_up_to_the_gap(before_text: str) -> None:
    page = "\n".join(x for x in before_text.splitlines() if 'position="2"' not in x)
    made = snapshot_of(page, 0.0)
    full = snapshot_of(before_text, 0.0)
    assert made.accepted_per_pos == full.accepted_per_pos[:2]


@pytest.mark.parametrize(
    ("delta", "k", "reason"),
    [
        # Mean acceptance length 51 at k=4: 50 draft tokens per draft.
        (dict(drafts=1.0, draft_tokens=50.0, accepted=50.0, per_pos=()), 4, "more than k=4"),
        (
            dict(drafts=100.0, draft_tokens=400.0, accepted=90.0, per_pos=(20.0, 40.0, 20.0, 10.0)),
            None,
            "rises from position 0 to 1",
        ),
        (
            dict(
                drafts=100.0,
                draft_tokens=400.0,
                accepted=90.0,
                per_pos=(40.0, 30.0, 10.0, 5.0, 5.0),
            ),
            4,
            "5 positions, more than k=4",
        ),
    ],
)
def test_impossible_curves_are_withheld(delta: dict, k: int | None, reason: str) -> None:  # type: ignore[type-arg]
    found = impossible_figures(
        delta["drafts"], delta["draft_tokens"], delta["accepted"], list(delta["per_pos"]), k=k
    )
    assert found is not None and reason in found


def test_a_real_curve_within_the_skew_passes() -> None:
    # Position 1 one count above position 0: one step between two counter updates.
    assert impossible_figures(1000.0, 4000.0, 1500.0, [600.0, 601.0, 200.0, 99.0], k=4) is None
