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
    """One probe cycle at `now`, then whatever it started beside the loop (the canary, the
    verdict listeners) run to the end."""

    async def once() -> None:
        await monitor.run_once(now)
        await monitor.settle()

    asyncio.run(once())


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
    assert "/metrics is not vLLM's: '<html>oops</html>'" in caplog.text
    # Readiness follows the engine, not the sidecar's scrape: the canary proves generation.
    readiness = monitor.readiness(0.0)
    assert readiness.ready and not readiness.checks["metrics"]


def test_unreadable_metrics_and_a_canary_that_never_answers_end_readiness(
    before_text: str,
) -> None:
    """No proof of generation for stall_timeout: the metrics cannot show progress and the
    canary times out (a timeout alone is not a failure: a busy engine answers late)."""
    engine = FakeEngine("<html>oops</html>")
    monitor = monitor_for(engine, stall_timeout=30.0, canary_timeout=0.2, canary_interval=10.0)
    cycle(monitor, 0.0)
    assert monitor.readiness(0.0).ready
    engine.completion_delay_s = 5.0
    for t in range(2, 40, 2):
        cycle(monitor, float(t))
        if t <= 30:
            assert monitor.readiness(float(t)).ready, t
    readiness = monitor.readiness(38.0)
    assert not readiness.ready
    assert "no proof of generation" in readiness.reason and "no vllm: series" in readiness.reason


def test_a_page_cut_inside_the_per_position_lines_is_used_as_far_as_it_goes() -> None:
    engine, counters = scripted()
    monitor = monitor_for(engine)
    for t in range(0, 20, 2):
        serve(engine, counters)
        cycle(monitor, float(t))
    serve(engine, counters)
    engine.metrics = engine.metrics[: engine.metrics.index('position="2"')]
    cycle(monitor, 20.0)
    assert sum(monitor.scrapes.dropped_samples.values()) == 0
    during = monitor.stats(20.0).windows["1m"]
    assert during.mean_acceptance_length == pytest.approx(1 + 100 / 50)
    assert during.verdict is Verdict.HEALTHY  # not "collapsed" for want of position 0
    for t in range(22, 30, 2):
        serve(engine, counters)
        cycle(monitor, float(t))
        assert_possible(monitor, float(t))
    after = monitor.stats(28.0).windows["1m"]
    assert after.per_position_acceptance == pytest.approx([0.8, 0.6, 0.4, 0.2])
    # What k = 1, 2, 3 would give with this draft: 1 + the first k position rates.
    assert after.smaller_k_acceptance_length == pytest.approx({1: 1.8, 2: 2.4, 3: 2.8})


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
    ],
    ids=["missing-counter", "inf", "nan", "goes-back", "duplicate"],
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
        def create_namespaced_event(self, namespace: str, body: object, **_: object) -> None:
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


def test_a_slow_api_server_never_holds_the_probe_loop(before_text: str, after_text: str) -> None:
    class SlowApi:
        def __init__(self) -> None:
            self.timeouts: list[object] = []

        def create_namespaced_event(self, namespace: str, body: object, **kw: object) -> None:
            self.timeouts.append(kw.get("_request_timeout"))
            time.sleep(3.0)  # an API server that answers in seconds

    api = SlowApi()
    events = VerdictEvents("pod-0", "serving", api=api, timeout=0.3)
    engine = FakeEngine(before_text)
    monitor = monitor_for(engine, thresholds=VerdictThresholds(min_drafts=1), verdict_window="1m")
    monitor.verdict_listeners.append(events)

    async def scenario() -> tuple[float, float]:
        await monitor.run_once(0.0)
        engine.metrics = after_text
        started = time.perf_counter()
        await monitor.run_once(30.0)  # the verdict changes: an Event is due
        cycle_s = time.perf_counter() - started
        started = time.perf_counter()
        await monitor.settle()
        return cycle_s, time.perf_counter() - started

    cycle_s, event_s = asyncio.run(scenario())
    assert cycle_s < 0.5  # the probes went on
    assert event_s < 1.0 and events.failures == 1  # given up at the deadline, counted
    assert api.timeouts == [0.3]  # and the client's own request carries the deadline


def test_a_slow_canary_runs_beside_the_loop(before_text: str) -> None:
    engine = FakeEngine(before_text)
    engine.completion_delay_s = 1.5
    monitor = monitor_for(engine, canary_timeout=5.0)

    async def scenario() -> tuple[float, bool, bool]:
        started = time.perf_counter()
        await monitor.run_once(0.0)
        took = time.perf_counter() - started
        fresh = monitor.readiness(0.0).checks["probe_fresh"]
        await monitor.settle()
        return took, fresh, monitor.readiness(0.0).ready

    took, fresh, ready = asyncio.run(scenario())
    assert took < 0.5 and fresh and ready


def test_a_dead_engine_core_on_an_idle_engine_is_seen_within_the_canary_interval(
    before_text: str,
) -> None:
    engine = FakeEngine(before_text)
    monitor = monitor_for(engine, canary_interval=15.0)
    cycle(monitor, 0.0)
    assert monitor.readiness(0.0).ready
    engine.completion_status = 500  # the core dies while nobody sends traffic
    t = 0.0
    while monitor.readiness(t).ready:
        t += 2.0
        cycle(monitor, t)
    assert t <= 16.0
    assert monitor.readiness(t).reason.startswith("engine answers /health but cannot generate")


def test_a_new_series_replaces_one_unseen_for_the_longest_window() -> None:
    engine, counters = scripted()
    windows = {"1m": 60.0, "5m": 300.0}  # the longest is 300 s
    monitor = monitor_for(engine, max_series=2, windows=windows, verdict_window="5m")
    burst = "".join(vllm_page(counters, model=f"burst-{i}") for i in range(50))
    engine.metrics = burst
    cycle(monitor, 0.0)
    assert len(monitor.windows) == 2 and monitor.dropped_series == 48
    engine.metrics = vllm_page(counters, model="relabelled")
    cycle(monitor, 100.0)
    assert ("model_name", "relabelled") not in {p for key in monitor.windows for p in key}
    cycle(monitor, 301.0)  # the burst's series unseen for longer than 300 s
    assert ("model_name", "relabelled") in {p for key in monitor.windows for p in key}
    assert monitor.evicted_series == 1


def test_figures_implying_more_than_k_draft_tokens_per_draft_are_withheld() -> None:
    engine, counters = scripted()
    monitor = monitor_for(engine, speculative_tokens=4)
    without_positions = "\n".join(
        line for line in vllm_page(counters).splitlines() if "per_pos" not in line
    )
    engine.metrics = without_positions
    cycle(monitor, 0.0)
    counters.drafts += 1
    counters.draft_tokens += 50  # mean acceptance length 51 at k=4
    counters.accepted += 50
    counters.generation += 51
    engine.metrics = "\n".join(
        line for line in vllm_page(counters).splitlines() if "per_pos" not in line
    )
    cycle(monitor, 2.0)
    stats = monitor.stats(2.0).windows["1m"]
    assert stats.mean_acceptance_length is None
    assert "more than k=4" in stats.verdict_reason


def test_logged_values_are_cut(caplog: pytest.LogCaptureFixture) -> None:
    from dflash_sidecar.log_limiter import LogLimiter

    limiter = LogLimiter(logging.getLogger("dflash_sidecar.test"))
    with caplog.at_level(logging.WARNING, logger="dflash_sidecar.test"):
        limiter.log(logging.WARNING, "k", "label %s, count %d", "x" * 5_000_000, 3)
    (record,) = caplog.records
    assert len(record.getMessage()) < 500 and "5000000 characters" in record.getMessage()
    assert "count 3" in record.getMessage()
