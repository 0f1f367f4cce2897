"""Property test: whatever sequence of pages an engine sends, the monitor's figures are possible.

Hypothesis drives the real monitor (through its HTTP client, with a scripted engine) with random
sequences of valid pages, truncated pages, NaN and infinite counters, duplicated series, engine
restarts, counters that go back, unreachable engines and garbage. After every scrape: no
exception escaped, every mean acceptance length lies in [1, k + 1], every rate in [0, 1], nothing
is NaN, and memory stays bounded.
"""

from __future__ import annotations

import asyncio
import math

from dflash_sidecar.engine_monitor import EngineMonitor
from dflash_sidecar.models import WindowStats
from dflash_sidecar.settings import SidecarSettings
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.service.fake_engine import Counters, FakeEngine, vllm_page

K = 4
EVENTS = st.sampled_from(
    [
        "serve",
        "serve",
        "serve",
        "idle",
        "restart",
        "truncate",
        "nan",
        "inf",
        "negative",
        "duplicate",
        "go-back",
        "garbage",
        "down",
        "second-engine",
    ]
)


def corrupt(page: str, event: str, data: st.DataObject) -> str:
    lines = page.splitlines()
    counter_lines = [
        i for i, x in enumerate(lines) if x.startswith("vllm:") and "_created" not in x
    ]
    target = data.draw(st.sampled_from(counter_lines))
    name_labels, _ = lines[target].rsplit(" ", 1)
    if event == "truncate":
        return page[: data.draw(st.integers(0, len(page)))]
    if event in ("nan", "inf", "negative"):
        lines[target] = f"{name_labels} {dict(nan='NaN', inf='+Inf', negative='-5')[event]}"
    elif event == "duplicate":
        lines.append(f"{name_labels} {data.draw(st.floats(0, 1e6))}")
    elif event == "go-back":
        lines[target] = f"{name_labels} {data.draw(st.floats(0, 10))}"
    elif event == "garbage":
        return data.draw(st.text(max_size=200))
    return "\n".join(lines) + "\n"


def check(window: WindowStats) -> None:
    mal = window.mean_acceptance_length
    assert mal is None or (1 <= mal <= K + 1), window
    rate = window.draft_acceptance_rate
    assert rate is None or 0 <= rate <= 1, window
    assert all(0 <= p <= 1 for p in window.per_position_acceptance), window
    for value in (window.output_tokens_per_s, window.drafts_per_s, window.span_seconds):
        assert value is None or (math.isfinite(value) and value >= 0), window
    assert math.isfinite(window.drafts) and window.drafts >= 0


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_no_page_sequence_yields_an_impossible_figure(data: st.DataObject) -> None:
    counters = Counters(per_pos=[0.0] * K)
    other = Counters(per_pos=[0.0] * K)
    engine = FakeEngine(vllm_page(counters))
    monitor = EngineMonitor(
        SidecarSettings(
            scrape_interval=2.0,
            windows={"1m": 60.0, "5m": 300.0},
            verdict_window="1m",
            max_series=4,
        ),
        client=engine.client(),
        started_at=0.0,
    )
    now = 0.0
    second_engine = False
    for event in data.draw(st.lists(EVENTS, min_size=5, max_size=60)):
        engine.reachable = event != "down"
        if event == "restart":
            counters = Counters(per_pos=[0.0] * K)
        if event in ("serve", "restart") or data.draw(st.booleans()):
            drafts = data.draw(st.integers(0, 64))
            accepted = sorted((data.draw(st.integers(0, drafts)) for _ in range(K)), reverse=True)
            counters.step(drafts, accepted, extra_tokens=data.draw(st.integers(0, 100)))
        second_engine = second_engine or event == "second-engine"
        page = vllm_page(counters)
        if second_engine:
            other.step(3, [2, 1, 1, 0])
            page += vllm_page(other, engine="1")
        engine.metrics = (
            corrupt(page, event, data)
            if event not in ("serve", "idle", "restart", "down", "second-engine")
            else page
        )
        now += data.draw(st.sampled_from([2.0, 2.0, 2.0, 0.5, 7.0, 61.0]))
        asyncio.run(monitor.run_once(now))
        stats = monitor.stats(now)
        for window in stats.windows.values():
            check(window)
        for series in stats.series:
            for window in series.windows.values():
                check(window)
        assert len(monitor.windows) <= 4
        assert all(len(w) <= monitor.settings.window_capacity for w in monitor.windows.values())
        assert len(monitor.scrapes.durations) <= 256
