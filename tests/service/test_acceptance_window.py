from __future__ import annotations

import math

import pytest
from dflash_sidecar import exposition
from dflash_sidecar.acceptance_window import AcceptanceWindow, Snapshot

from tests.service.conftest import raw_counter

KEY = (("engine", "0"), ("model_name", "tiny"))


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


def test_delta_between_the_two_recorded_expositions(before_text: str, after_text: str) -> None:
    window = AcceptanceWindow(capacity=10)
    window.add(Snapshot.of(100.0, exposition.parse(before_text).series[KEY]))
    window.add(Snapshot.of(130.0, exposition.parse(after_text).series[KEY]))
    delta = window.delta(60)
    assert delta is not None and delta.seconds == 30.0
    name = "vllm:spec_decode_num_drafts_total"
    assert delta.drafts == raw_counter(after_text, name) - raw_counter(before_text, name)
    name = "vllm:generation_tokens_total"
    assert delta.generation_tokens == raw_counter(after_text, name) - raw_counter(before_text, name)


def test_window_only_spans_its_length() -> None:
    window = AcceptanceWindow(capacity=100)
    for t in range(0, 121, 2):
        window.add(
            snap(float(t), drafts=t * 10, accepted=t * 5, per_pos=(t * 3, t * 2), gen=t * 20)
        )
    delta = window.delta(60)
    assert delta is not None
    assert delta.seconds == 60 and delta.drafts == 600 and delta.accepted_per_pos == (180, 120)


def test_counter_reset_restarts_the_window_without_negative_rates() -> None:
    window = AcceptanceWindow(capacity=100)
    window.add(snap(0, 1000, 500, (300, 200), 5000))
    window.add(snap(2, 1010, 505, (303, 202), 5050))
    assert window.add(snap(4, 3, 1, (1, 0), 10))  # engine restarted
    assert window.resets == 1 and len(window) == 1
    assert window.delta(60) is None
    window.add(snap(6, 13, 6, (4, 2), 60))
    delta = window.delta(60)
    assert delta is not None
    assert all(
        v >= 0 and not math.isnan(v)
        for v in (delta.drafts, delta.accepted, delta.generation_tokens)
    )


def test_a_changed_number_of_positions_is_a_reset() -> None:
    window = AcceptanceWindow(capacity=10)
    window.add(snap(0, 10, 5, (3, 2), 50))
    assert window.add(snap(2, 20, 10, (6, 3, 1), 100))


def test_memory_is_bounded() -> None:
    window = AcceptanceWindow(capacity=453)
    for t in range(50_000):
        window.add(snap(t * 2.0, t, t / 2, (t / 2,), t * 3))
    assert len(window) == 453


def test_capacity_must_hold_two_snapshots() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        AcceptanceWindow(capacity=1)
