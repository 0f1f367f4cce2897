from __future__ import annotations

import asyncio

import pytest
from dflash_sidecar.engine_monitor import EngineMonitor
from dflash_sidecar.events import VerdictEvents
from dflash_sidecar.settings import SidecarSettings
from dflash_sidecar.verdict import Verdict, VerdictThresholds

from tests.service.conftest import raw_counter
from tests.service.fake_engine import FakeEngine


def monitor_for(engine: FakeEngine, **settings: object) -> EngineMonitor:
    values: dict[str, object] = {"scrape_interval_s": 2.0, "canary_interval_s": 10.0}
    values.update(settings)
    return EngineMonitor(SidecarSettings.model_validate(values), client=engine.client())


def cycle(monitor: EngineMonitor, now: float) -> None:
    asyncio.run(monitor.run_once(now))


def test_acceptance_length_equals_the_raw_counters(before_text: str, after_text: str) -> None:
    engine = FakeEngine(before_text)
    monitor = monitor_for(engine)
    cycle(monitor, 100.0)
    engine.metrics = after_text
    cycle(monitor, 130.0)
    stats = monitor.stats().windows["1m"]

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


def test_readiness_follows_the_engine(before_text: str, after_text: str) -> None:
    engine = FakeEngine(before_text)
    engine.reachable = False
    monitor = monitor_for(engine)
    assert monitor.readiness(0.0).reason == "no probe of the engine yet"
    cycle(monitor, 0.0)
    readiness = monitor.readiness(0.0)
    assert not readiness.ready and readiness.reason.startswith("engine not healthy: GET")
    engine.reachable, engine.health_status = True, 503
    cycle(monitor, 2.0)
    assert monitor.readiness(2.0).reason == "engine not healthy: /health answered 503"
    engine.health_status = 200
    cycle(monitor, 4.0)  # healthy, idle: the canary proves it generates
    assert engine.completions == 1
    assert monitor.readiness(4.0).ready
    engine.reachable = False  # the engine dies
    cycle(monitor, 6.0)
    assert not monitor.readiness(6.0).ready
    assert not monitor.readiness(100.0).checks["probe_fresh"]


def test_health_200_with_a_dead_engine_core_is_not_ready(before_text: str) -> None:
    engine = FakeEngine(before_text)
    engine.completion_status = 500
    monitor = monitor_for(engine)
    cycle(monitor, 0.0)
    readiness = monitor.readiness(0.0)
    assert not readiness.ready
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


def test_engine_restart_restarts_the_window(before_text: str, after_text: str) -> None:
    engine = FakeEngine(after_text)
    monitor = monitor_for(engine)
    cycle(monitor, 0.0)
    cycle(monitor, 2.0)
    engine.metrics = before_text  # counters went back: a new engine
    cycle(monitor, 4.0)
    stats = monitor.stats()
    assert stats.series[0].counter_resets == 1
    assert stats.windows["1m"].mean_acceptance_length is None
    assert stats.windows["1m"].verdict == Verdict.NO_DATA


def test_garbage_metrics_page_is_an_error_not_a_crash() -> None:
    engine = FakeEngine("<html>oops</html>")
    monitor = monitor_for(engine)
    cycle(monitor, 0.0)
    assert monitor.scrapes.errors["not_vllm_metrics"] == 1
    readiness = monitor.readiness(0.0)
    assert not readiness.ready and "metrics unavailable" in readiness.reason


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
