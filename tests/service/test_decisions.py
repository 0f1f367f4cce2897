"""The sidecar's rules as functions of its state (dflash_sidecar.decisions): readiness, liveness,
proof of generation and each window's figures and verdict, without a probe loop, an engine or a
clock: every case builds the state it needs and asks at a given time."""

from __future__ import annotations

import pytest
from dflash_sidecar import decisions
from dflash_sidecar.acceptance_window import Delta
from dflash_sidecar.decisions import ProbeState
from dflash_sidecar.engine_state import EngineState, EngineStateTracker
from dflash_sidecar.settings import SidecarSettings
from dflash_sidecar.verdict import Verdict

SETTINGS = SidecarSettings.model_validate({"stall_timeout": 60, "engine_down_grace": 120})
NOW = 1000.0


def engine(state: EngineState, since: float = NOW - 30) -> EngineStateTracker:
    tracked = EngineStateTracker(started_at=0.0, startup_budget=SETTINGS.startup_budget)
    tracked.state, tracked.since = state, since
    return tracked


def serving_probe(**changes: object) -> ProbeState:
    """An engine answering /health, its metrics read, a token 5 s ago, probed just now."""
    probe = ProbeState(
        health_ok=True,
        health_detail="GET /health answered 200",
        metrics_ok=True,
        last_probe_at=NOW - 1,
        last_progress_at=NOW - 5,
        requests_running=2,
    )
    for name, value in changes.items():
        setattr(probe, name, value)
    return probe


@pytest.mark.parametrize(
    ("probe", "state", "reason"),
    [
        (ProbeState(), EngineState.STARTING, "no probe of the engine yet"),
        (serving_probe(last_probe_at=NOW - 60), EngineState.SERVING, "60s old (monitor stuck)"),
        (
            serving_probe(health_ok=False, health_detail="connect refused"),
            EngineState.STARTING,
            "engine loading: no answer from /health yet (connect refused); 1000s of the 3600s",
        ),
        (
            serving_probe(health_ok=False, health_detail="timeout"),
            EngineState.START_TIMEOUT,
            "did not come up within the 3600s startup budget: timeout",
        ),
        (
            serving_probe(health_ok=False, health_detail="connect refused"),
            EngineState.DOWN,
            "engine down for 30s: connect refused",
        ),
        (
            serving_probe(canary_failure="500 from /v1/completions"),
            EngineState.NOT_GENERATING,
            "cannot generate: 500 from /v1/completions",
        ),
        (
            serving_probe(last_progress_at=NOW - 90),
            EngineState.NOT_GENERATING,
            "2 requests running, no tokens for 90s",
        ),
        (
            serving_probe(
                metrics_ok=False,
                metrics_detail="timeout",
                requests_running=None,  # unknown while /metrics cannot be read
                last_progress_at=NOW - 90,
            ),
            EngineState.NOT_GENERATING,
            "no proof of generation for 90s: the engine's metrics are unreadable (timeout)",
        ),
        (
            serving_probe(last_progress_at=None),
            EngineState.NOT_GENERATING,
            "waiting for the first generated token",
        ),
    ],
    ids=[
        "no-probe", "stale", "starting", "start-timeout", "down", "canary", "stalled",
        "unproven", "first-token",
    ],
)  # fmt: skip
def test_each_reason_not_to_be_ready(probe: ProbeState, state: EngineState, reason: str) -> None:
    ready = decisions.readiness(probe, engine(state), SETTINGS, NOW)
    assert not ready.ready and reason in ready.reason, ready.reason
    assert ready.state is state


def test_ready_when_healthy_and_generating() -> None:
    ready = decisions.readiness(serving_probe(), engine(EngineState.SERVING), SETTINGS, NOW)
    assert ready.ready and ready.reason == "engine healthy and generating"
    assert ready.checks == {
        "probe_fresh": True,
        "health": True,
        "metrics": True,
        "generating": True,
    }


def test_an_idle_engine_is_generating_until_the_stall_timeout_only_with_requests_running() -> None:
    idle = serving_probe(requests_running=0, last_progress_at=NOW - 500)
    assert decisions.generating(idle, SETTINGS, NOW)  # nothing to generate: not stalled
    busy = serving_probe(requests_running=1, last_progress_at=NOW - 61)
    assert decisions.stalled(busy, SETTINGS, NOW) and not decisions.generating(busy, SETTINGS, NOW)
    assert not decisions.stalled(serving_probe(requests_running=1), SETTINGS, NOW)


@pytest.mark.parametrize(
    ("state", "seconds", "probed_ago", "alive"),
    [
        (EngineState.DOWN, 119, 1, True),  # within engine_down_grace
        (EngineState.DOWN, 121, 1, False),
        (EngineState.DOWN, 500, 60, True),  # a stale probe never restarts the engine
        (EngineState.NOT_GENERATING, 599, 1, True),  # within not_generating_grace (600)
        (EngineState.NOT_GENERATING, 601, 1, False),
        (EngineState.STARTING, 3000, 1, True),  # loading is never a reason to restart
        (EngineState.START_TIMEOUT, 5000, 1, True),
        (EngineState.SERVING, 9000, 1, True),
    ],
)
def test_liveness_restarts_only_a_long_proven_failure(
    state: EngineState, seconds: float, probed_ago: float, alive: bool
) -> None:
    live = decisions.liveness(
        serving_probe(last_probe_at=NOW - probed_ago), engine(state, NOW - seconds), SETTINGS, NOW
    )
    assert live.alive is alive, live.reason
    assert live.state is state


def delta(drafts: float, accepted_per_pos: tuple[float, ...], k: int = 4) -> Delta:
    accepted = sum(accepted_per_pos)
    return Delta(
        seconds=30.0,
        drafts=drafts,
        draft_tokens=drafts * k,
        accepted=accepted,
        accepted_per_pos=accepted_per_pos,
        generation_tokens=drafts + accepted,
        pos_drafts=drafts,
        pos_seconds=30.0,
    )


@pytest.mark.parametrize(
    ("increase", "verdict", "reason"),
    [
        (None, Verdict.NO_DATA, "why none"),
        (delta(10, (9, 8, 7, 6)), Verdict.NO_DATA, "10 drafts in the window (< 20)"),
        (delta(100, (90, 80, 70, 60)), Verdict.HEALTHY, "mean acceptance length 4.00"),
        (delta(100, (60, 20, 10, 0)), Verdict.DEGRADED, "below the degraded thresholds"),
        (delta(100, (5, 3, 1, 0)), Verdict.COLLAPSED, "almost never accepted"),
        (delta(100, (10, 50, 0, 0)), Verdict.NO_DATA, "figures withheld: per-position"),
    ],
    ids=["no-delta", "few-drafts", "healthy", "degraded", "collapsed", "impossible"],
)
def test_window_figures_and_verdict(increase: Delta | None, verdict: Verdict, reason: str) -> None:
    stats = decisions.window_stats(increase, 60.0, "why none", SETTINGS)
    assert stats.verdict is verdict and reason in stats.verdict_reason, stats.verdict_reason
    if increase is not None and "withheld" not in reason:  # figures, a verdict or too few
        assert increase is not None
        assert stats.mean_acceptance_length == pytest.approx(
            1 + increase.accepted / increase.drafts
        )
        assert stats.per_position_acceptance == pytest.approx(
            [p / increase.drafts for p in increase.accepted_per_pos]
        )
        assert stats.output_tokens_per_s == pytest.approx(increase.generation_tokens / 30)
    else:
        assert stats.mean_acceptance_length is None and stats.per_position_acceptance == []


def scheduled(drafts: float, draft_tokens: float, accepted_per_pos: tuple[float, ...]) -> Delta:
    """A window under a k schedule: fewer tokens drafted per draft than the largest k."""
    accepted = sum(accepted_per_pos)
    return Delta(
        seconds=30.0, drafts=drafts, draft_tokens=draft_tokens, accepted=accepted,
        accepted_per_pos=accepted_per_pos, generation_tokens=drafts + accepted,
        pos_drafts=drafts, pos_seconds=30.0, known_k=4,
    )  # fmt: skip


K4 = SidecarSettings.model_validate({"speculative_tokens": 4})


def test_a_schedule_that_lowered_k_is_judged_by_what_that_k_allows() -> None:
    """The window measured with the schedule [[1,1,4],[2,64,1]] at concurrency 6 (issue 55):
    1.06 tokens per draft, per position 0.61 / 0.007 / 0.003 / 0, mean acceptance length 1.62.
    Judged as if k were 4 it is 'degraded'; the k in effect allows it: healthy, and the
    positions the schedule hardly drafted are not reported as measured zeros."""
    window = scheduled(1000, 1060, (610, 7, 3, 0))
    stats = decisions.window_stats(window, 60.0, "why none", K4)
    assert stats.k_in_effect == pytest.approx(1.06)
    assert stats.mean_acceptance_length == pytest.approx(1.62)
    assert stats.verdict is Verdict.HEALTHY, stats.verdict_reason
    assert "k 1.06 in effect of 4" in stats.verdict_reason
    assert stats.per_position_acceptance == pytest.approx([0.61])
    assert stats.smaller_k_acceptance_length == {}
    # The same figures at a static k of 4 are what they are: degraded.
    static = decisions.window_stats(delta(1000, (610, 7, 3, 0)), 60.0, "why none", K4)
    assert static.k_in_effect == 4 and static.verdict is Verdict.DEGRADED
    assert len(static.per_position_acceptance) == 4


def test_a_draft_never_accepted_under_a_schedule_still_collapses() -> None:
    never = decisions.window_stats(scheduled(1000, 1060, (3, 0, 0, 0)), 60.0, "why", K4)
    assert never.verdict is Verdict.COLLAPSED, never.verdict_reason
    weak = decisions.window_stats(scheduled(1000, 1060, (300, 0, 0, 0)), 60.0, "why", K4)
    assert weak.verdict is Verdict.DEGRADED, weak.verdict_reason  # position 0 below 0.4


def test_without_the_configured_k_the_widest_per_position_page_stands_for_it() -> None:
    unset = SidecarSettings.model_validate({})
    assert unset.speculative_tokens is None
    stats = decisions.window_stats(scheduled(1000, 1060, (610, 7, 3, 0)), 60.0, "why", unset)
    assert stats.verdict is Verdict.HEALTHY and stats.per_position_acceptance == [0.61]
