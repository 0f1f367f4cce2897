"""The engines' /metrics counters around a pass: snapshots of every engine's page (each series
taken as the sidecar takes it), what they did between two snapshots (by the sidecar's rules:
restarts and counters that went back named, never mixed in), the acceptance of that increase,
and the running batch sampled during a level."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field

from dflash_sidecar import metrics_parser
from dflash_sidecar.acceptance_window import (
    AcceptanceWindow,
    Delta,
    SampleProblem,
    acceptance_figures,
)
from dflash_sidecar.acceptance_window import Snapshot as CounterSnapshot
from dflash_sidecar.metrics_parser import SeriesKey
from dflash_sidecar.vllm_metrics import REQUESTS_RUNNING

from dflash_ops.bench.core.client import Endpoint
from dflash_ops.bench.core.results import (
    SpecDecodeStats,
)

SeriesId = tuple[str, SeriesKey]  # (the page's URL, the series' labels)


@dataclass(frozen=True)
class Snapshot:
    """The engines' cumulative counters at one moment: each series of each page counted, as
    the sidecar takes it (dflash_sidecar.acceptance_window.Snapshot; a page it would not trust
    is left out), and the prefix-cache and finished-request counters."""

    series: dict[SeriesId, CounterSnapshot]
    speculating: bool  # some series exports speculative-decoding counters
    prefix: tuple[float, float] | None  # (hit tokens, queried tokens)
    # Finished requests per engine counted (--metrics-url), for each replica's share.
    finished: dict[str, float] = field(default_factory=dict)
    # The engines whose page was read, and those whose was not (hung, refused, an error).
    read: tuple[str, ...] = ()
    unread: tuple[str, ...] = ()


@dataclass(frozen=True)
class Increase:
    """What the counters did between two snapshots, by the sidecar's rules: each series seen at
    both ends is a window of those two snapshots, and their increases add up."""

    delta: Delta | None
    restarted: bool  # an engine restarted (its generation counter went back)
    inconsistent: bool  # a counter went back while the engine kept running: not trusted


def increase(before: Snapshot, after: Snapshot) -> Increase:
    total: Delta | None = None
    restarted = inconsistent = False
    for key, old in before.series.items():
        new = after.series.get(key)
        if new is None:
            continue
        window = AcceptanceWindow(2)
        window.add(old)
        outcome = window.add(new)
        if isinstance(outcome, SampleProblem):
            inconsistent = True
        elif outcome:
            restarted = True
        elif (delta := window.delta(math.inf, new.at, math.inf)) is not None:
            total = delta if total is None else total + delta
    return Increase(total, restarted, inconsistent)


def spec_stats(delta: Delta | None) -> SpecDecodeStats | str | None:
    """The acceptance of a counter increase by the sidecar's formula; why it is withheld; or
    None without one."""
    if delta is None:
        return None
    figures = acceptance_figures(delta)
    if isinstance(figures, str):
        return figures
    return SpecDecodeStats(
        drafts=figures.drafts,
        draft_tokens=figures.draft_tokens,
        accepted=figures.accepted,
        mean_acceptance_length=figures.mean_acceptance_length,
        draft_acceptance_rate=figures.draft_acceptance_rate,
        per_position_acceptance=figures.per_position,
        k_in_effect=figures.k_in_effect,
    )


def snapshot_of(pages: dict[str, str | None], at: float) -> Snapshot:
    """The counters of the engines' /metrics pages (by URL) read at `at` (monotonic seconds)."""
    series: dict[SeriesId, CounterSnapshot] = {}
    speculating = False
    for url, text in pages.items():
        for key, sample in metrics_parser.parse(text or "").series.items():
            speculating = speculating or sample.has_spec_decode
            taken = CounterSnapshot.of(at, sample)
            if isinstance(taken, CounterSnapshot):
                series[(url, key)] = taken
    finished = {
        url: n
        for url, text in pages.items()
        if (n := Endpoint.finished_requests_of(text)) is not None
    }
    read = tuple(url for url, text in pages.items() if text is not None)
    unread = tuple(url for url, text in pages.items() if text is None)
    return Snapshot(
        series, speculating, Endpoint.prefix_cache_of(*pages.values()), finished, read, unread
    )


async def snapshot(endpoint: Endpoint) -> Snapshot:
    return snapshot_of(await endpoint.metrics_pages(), time.monotonic())


def running_requests_of(pages: dict[str, str | None]) -> float | None:
    """vllm:num_requests_running summed over the engines' pages; None if none exports it."""
    found = None
    for text in pages.values():
        if text and REQUESTS_RUNNING in text:
            series = metrics_parser.parse(text).series.values()
            found = (found or 0.0) + sum(sample.requests_running for sample in series)
    return found


# How often the running batch is sampled during a pass, and when first (requests admitted).
RUNNING_SAMPLE_INTERVAL_S = 1.0
RUNNING_FIRST_SAMPLE_S = 0.5


async def sample_running(endpoint: Endpoint, into: list[float]) -> None:
    """Append the running batch to `into` about once a second until cancelled."""
    await asyncio.sleep(RUNNING_FIRST_SAMPLE_S)
    while True:
        running = running_requests_of(await endpoint.metrics_pages())
        if running is not None:
            into.append(running)
        await asyncio.sleep(RUNNING_SAMPLE_INTERVAL_S)
