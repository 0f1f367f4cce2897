from __future__ import annotations

import asyncio
import logging
import time

import pytest
from dflash_sidecar.engine_monitor import EngineMonitor
from dflash_sidecar.engine_state import EngineState
from dflash_sidecar.events import VerdictEvents
from dflash_sidecar.settings import SidecarSettings
from dflash_sidecar.verdict import Verdict, VerdictThresholds

from tests.service.conftest import raw_counter
from tests.service.fake_engine import Counters, FakeEngine, vllm_page


def monitor_for(engine: FakeEngine, **settings: object) -> EngineMonitor:
    values: dict[str, object] = {"scrape_interval": 2.0, "canary_interval": 10.0}
    values.update(settings)
    return EngineMonitor(
        SidecarSettings.model_validate(values), client=engine.client(), started_at=0.0
    )


def cycle(monitor: EngineMonitor, now: float) -> None:
    asyncio.run(monitor.run_once(now))


def test_acceptance_length_equals_the_raw_counters(before_text: str, after_text: str) -> None:
    engine = FakeEngine(before_text)
    monitor = monitor_for(engine)
    cycle(monitor, 100.0)
    engine.metrics = after_text
    cycle(monitor, 130.0)
    stats = monitor.stats(130.0).windows["1m"]

    def d(name: str, position: int | None = None) -> float:
        return raw_counter(after_text, name, position) - raw_counter(before_text, name, position)

    drafts = d("vllm:spec_decode_num_drafts_total")
    accepted = d("vllm:spec_decode_num_accepted_tokens_total")
    assert stats.drafts == drafts
    assert stats.mean_acceptance_length == pytest.approx(1 + accepted / drafts)
    assert stats.draft_acceptance_rate == pytest.approx(
        accepted / d("vllm:spec_decode_num_draft_tokens_total")
    )
    assert stats.per_position_acceptance[0] == pytest.approx(
        d("vllm:spec_decode_num_accepted_tokens_per_pos_total", 0) / drafts
    )
    assert stats.output_tokens_per_s == pytest.approx(d("vllm:generation_tokens_total") / 30)
    assert stats.drafts_per_s == pytest.approx(drafts / 30)


def test_readiness_follows_the_engine(before_text: str) -> None:
    engine = FakeEngine(before_text)
    engine.reachable = False
    monitor = monitor_for(engine)
    assert monitor.readiness(0.0).reason == "no probe of the engine yet"
    cycle(monitor, 0.0)
    readiness = monitor.readiness(0.0)
    assert not readiness.ready and readiness.state is EngineState.STARTING
    assert readiness.reason.startswith("engine loading: no answer from /health yet (GET /health")
    engine.reachable = True
    cycle(monitor, 2.0)  # healthy, idle: the canary proves it generates
    assert engine.completions == 1
    assert monitor.readiness(2.0).ready
    engine.health_status = 503
    cycle(monitor, 4.0)
    readiness = monitor.readiness(4.0)
    assert readiness.state is EngineState.DOWN
    assert readiness.reason == "engine down for 0s: GET /health answered 503"
    engine.reachable = False  # the engine dies
    cycle(monitor, 6.0)
    reason = monitor.readiness(6.0).reason
    assert reason.startswith("engine down for 2s: GET /health: ConnectError")
    assert not monitor.readiness(100.0).checks["probe_fresh"]


def test_health_200_with_a_dead_engine_core_is_not_ready(before_text: str) -> None:
    engine = FakeEngine(before_text)
    engine.completion_status = 500
    monitor = monitor_for(engine)
    cycle(monitor, 0.0)
    readiness = monitor.readiness(0.0)
    assert not readiness.ready and readiness.state is EngineState.NOT_GENERATING
    assert readiness.reason.startswith("engine answers /health but cannot generate")
    assert monitor.scrapes.errors["canary"] == 1


def test_token_progress_replaces_the_canary(before_text: str, after_text: str) -> None:
    engine = FakeEngine(before_text)
    monitor = monitor_for(engine)
    cycle(monitor, 0.0)
    engine.metrics = after_text
    engine.completion_status = 500  # would fail, but traffic already proves generation
    for t in (2.0, 4.0):
        cycle(monitor, t)
    assert engine.completions == 1  # only the first, idle cycle needed a canary
    assert monitor.readiness(4.0).ready


def test_the_canary_is_rare_on_an_idle_engine(before_text: str) -> None:
    engine = FakeEngine(before_text)
    monitor = monitor_for(engine, canary_interval=60.0)
    for t in range(0, 300, 2):
        cycle(monitor, float(t))
    assert engine.completions == 5  # one a minute
    assert monitor.readiness(298.0).ready


def test_engine_restart_restarts_the_window(before_text: str, after_text: str) -> None:
    engine = FakeEngine(after_text)
    monitor = monitor_for(engine)
    cycle(monitor, 0.0)
    cycle(monitor, 2.0)
    engine.metrics = before_text  # counters went back: a new engine
    cycle(monitor, 4.0)
    stats = monitor.stats(4.0)
    assert stats.series[0].counter_resets == 1
    assert stats.windows["1m"].mean_acceptance_length is None
    assert stats.windows["1m"].verdict == Verdict.NO_DATA


def test_garbage_metrics_page_is_an_error_not_a_crash(caplog: pytest.LogCaptureFixture) -> None:
    engine = FakeEngine("<html>oops</html>")
    monitor = monitor_for(engine)
    with caplog.at_level(logging.WARNING, logger="dflash_sidecar"):
        cycle(monitor, 0.0)
    assert monitor.scrapes.errors["not_vllm_metrics"] == 1
    readiness = monitor.readiness(0.0)
    assert not readiness.ready and "metrics unavailable" in readiness.reason
    assert "/metrics is not vLLM's: '<html>oops</html>'" in caplog.text


# -- faults a hostile or broken engine can produce (issue: numbers a user can trust) ----------


def scripted(k: int = 4) -> tuple[FakeEngine, Counters]:
    counters = Counters(per_pos=[0.0] * k)
    return FakeEngine(vllm_page(counters)), counters


def serve(engine: FakeEngine, counters: Counters) -> None:
    counters.step(50, [40, 30, 20, 10], extra_tokens=0)
    engine.metrics = vllm_page(counters)


def assert_possible(monitor: EngineMonitor, now: float, k: int = 4) -> None:
    stats = monitor.stats(now)
    for window in [*stats.windows.values(), *(w for s in stats.series for w in s.windows.values())]:
        mal = window.mean_acceptance_length
        assert mal is None or 1 <= mal <= k + 1, window
        rate = window.draft_acceptance_rate
        assert rate is None or 0 <= rate <= 1, window
        assert all(0 <= p <= 1 for p in window.per_position_acceptance), window
        assert window.output_tokens_per_s is None or window.output_tokens_per_s >= 0


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda page: page.replace("generation_tokens_total{", "GARBLED{", 1),
        lambda page: page.replace(
            next(x for x in page.splitlines() if x.startswith("vllm:spec_decode_num_drafts_t")),
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny"} +Inf',
        ),
        lambda page: page.replace(
            next(
                x
                for x in page.splitlines()
                if x.startswith("vllm:spec_decode_num_accepted_tokens_t")
            ),
            'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny"} NaN',
        ),
        lambda page: page.replace(
            next(
                x
                for x in page.splitlines()
                if x.startswith("vllm:spec_decode_num_accepted_tokens_t")
            ),
            'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny"} 3.0',
        ),
        lambda page: (
            page
            + next(
                x for x in page.splitlines() if x.startswith("vllm:spec_decode_num_drafts_total")
            )
            + "\n"
        ),
        lambda page: page[: page.index('position="2"')],
    ],
    ids=["missing-counter", "inf", "nan", "goes-back", "duplicate", "truncated"],
)
def test_one_bad_scrape_is_dropped_and_the_next_figures_are_true(corrupt) -> None:  # type: ignore[no-untyped-def]
    engine, counters = scripted()
    monitor = monitor_for(engine)
    for t in range(0, 20, 2):
        serve(engine, counters)
        cycle(monitor, float(t))
    before = (counters.drafts, counters.accepted, counters.generation)
    serve(engine, counters)
    engine.metrics = corrupt(engine.metrics)
    cycle(monitor, 20.0)
    assert monitor.stats(20.0).series[0].counter_resets == 0
    assert sum(monitor.scrapes.dropped_samples.values()) == 1
    for t in range(22, 40, 2):
        serve(engine, counters)
        cycle(monitor, float(t))
        assert_possible(monitor, float(t))
    stats = monitor.stats(38.0).windows["1m"]
    drafts, accepted, generation = (
        counters.drafts - before[0] + 0.0,
        counters.accepted - before[1],
        counters.generation - before[2],
    )
    # The window holds every good scrape: from t=0 (the first) to t=38.
    assert stats.drafts == counters.drafts - 50
    assert stats.mean_acceptance_length == pytest.approx(1 + 100 / 50)
    assert stats.output_tokens_per_s == pytest.approx((counters.generation - 150) / 38)
    assert drafts > 0 and accepted > 0 and generation > 0


def test_a_truncated_page_never_breaks_stats_or_metrics() -> None:
    from dflash_sidecar.app import create_app
    from fastapi.testclient import TestClient

    engine, counters = scripted()
    monitor = monitor_for(engine)
    for t in range(0, 10, 2):
        serve(engine, counters)
        cycle(monitor, float(t))
    page = vllm_page(counters)
    engine.metrics = page[: page.index('position="1"')]
    cycle(monitor, 10.0)
    with TestClient(create_app(monitor.settings, monitor), raise_server_exceptions=False) as app:
        assert app.get("/stats").status_code == 200
        body = app.get("/metrics")
        assert body.status_code == 200 and "dflash_engine_ready" in body.text


def test_windows_end_now_a_killed_engine_is_never_healthy() -> None:
    engine, counters = scripted()
    monitor = monitor_for(engine, thresholds=VerdictThresholds(min_drafts=10))
    for t in range(0, 62, 2):
        serve(engine, counters)
        cycle(monitor, float(t))
    assert monitor.stats(60.0).windows["1m"].verdict == Verdict.HEALTHY
    engine.reachable = False
    for t in range(62, 132, 2):
        cycle(monitor, float(t))
    stats = monitor.stats(130.0)
    for window in stats.windows.values():
        assert window.output_tokens_per_s is None
        assert window.verdict == Verdict.NO_DATA
        assert window.verdict_reason == "no data: the engine is down"


def test_a_trickling_health_answer_is_cut_at_one_total_deadline() -> None:
    engine, _ = scripted()
    engine.health_trickle_s = 0.05  # 1000 bytes: 50 s if each read had its own timeout
    monitor = monitor_for(engine, scrape_timeout=0.5)
    started = time.monotonic()
    cycle(monitor, 0.0)
    assert time.monotonic() - started < 2.0
    assert monitor.scrapes.errors["timeout"] == 1
    assert monitor.readiness(0.0).reason.startswith("engine loading: no answer from /health yet")


def test_repeated_faults_are_logged_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    engine, counters = scripted()
    monitor = monitor_for(engine)
    with caplog.at_level(logging.WARNING, logger="dflash_sidecar"):
        for t in range(0, 200, 2):
            serve(engine, counters)
            engine.metrics += 'vllm:generation_tokens_total{engine="0",model_name="tiny"} oops\n'
            cycle(monitor, float(t))
    assert monitor.scrapes.parse_errors == 100
    assert 1 <= caplog.text.count("malformed lines") <= 2  # not once per scrape


def test_liveness_fails_only_after_a_long_proven_failure(before_text: str) -> None:
    engine = FakeEngine(before_text)
    monitor = monitor_for(engine, engine_down_grace=120.0, not_generating_grace=600.0)
    engine.reachable = False
    for t in range(0, 400, 2):  # loading: never a reason to restart
        cycle(monitor, float(t))
        assert monitor.liveness(float(t)).alive
    engine.reachable = True
    cycle(monitor, 400.0)
    engine.completion_status = 500  # /health 200, engine core dead: the canary at 410 fails
    for t in range(402, 1010, 2):
        cycle(monitor, float(t))
    assert monitor.liveness(1008.0).alive  # 598 s not generating
    cycle(monitor, 1010.0)
    liveness = monitor.liveness(1010.0)
    assert not liveness.alive and liveness.state is EngineState.NOT_GENERATING
    engine.completion_status, engine.reachable = 200, False
    for t in range(1012, 1132, 2):  # down from 1012
        cycle(monitor, float(t))
    assert monitor.liveness(1130.0).alive  # down 118 s
    cycle(monitor, 1132.0)
    assert not monitor.liveness(1132.0).alive


def test_an_engine_that_never_comes_up_times_out(before_text: str) -> None:
    engine = FakeEngine(before_text)
    engine.reachable = False
    monitor = monitor_for(engine, startup_budget=300.0)
    cycle(monitor, 299.0)
    assert monitor.engine.state is EngineState.STARTING
    cycle(monitor, 301.0)
    assert monitor.engine.state is EngineState.START_TIMEOUT
    assert "did not come up within the 300s startup budget" in monitor.readiness(301.0).reason


def test_verdict_changes_reach_listeners_and_events_survive_a_dead_api(
    before_text: str, after_text: str
) -> None:
    class DeadApi:
        def create_namespaced_event(self, namespace: str, body: object) -> None:
            raise ConnectionError("no route to the API server")

    events = VerdictEvents("pod-0", "serving", api=DeadApi())
    seen: list[tuple[Verdict, Verdict]] = []
    engine = FakeEngine(before_text)
    monitor = monitor_for(engine, thresholds=VerdictThresholds(min_drafts=1), verdict_window="1m")
    monitor.verdict_listeners += [lambda p, c, r: seen.append((p, c)), events]
    cycle(monitor, 0.0)
    engine.metrics = after_text
    cycle(monitor, 30.0)
    assert len(seen) == 1 and seen[0][0] == Verdict.NO_DATA
    assert events.failures == 1
