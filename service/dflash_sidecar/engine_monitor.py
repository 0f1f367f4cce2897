"""Background monitor of one vLLM engine: scrapes `/health` and `/metrics` on loopback, keeps
the acceptance windows, proves the engine can generate, and decides readiness.

Readiness needs more than `/health`: vLLM can answer 200 there while its engine core is dead
(e.g. a kernel that rejects the model after start-up). So the monitor also requires token
progress: either the engine's generation counter moved since the last check, or a one-token
canary completion succeeded; and while requests run, tokens must keep coming.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from dflash_sidecar import exposition
from dflash_sidecar.acceptance_window import (
    AcceptanceWindow,
    Delta,
    Snapshot,
    acceptance_ratios,
)
from dflash_sidecar.exposition import SeriesKey
from dflash_sidecar.models import Readiness, ScrapeHealth, SeriesStats, StatsResponse, WindowStats
from dflash_sidecar.settings import SidecarSettings
from dflash_sidecar.verdict import Verdict, judge

log = logging.getLogger("dflash_sidecar")

VerdictListener = Callable[[Verdict, Verdict, str], None]


@dataclass
class ProbeState:
    health_ok: bool = False
    health_detail: str = "no probe yet"
    metrics_ok: bool = False
    last_probe_at: float | None = None
    last_progress_at: float | None = None  # generation counter moved or canary succeeded
    last_generation_tokens: float | None = None
    requests_running: float = 0.0
    canary_due_at: float = 0.0
    canary_failure: str | None = None
    served_model: str | None = None


@dataclass
class ScrapeCounters:
    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    parse_errors: int = 0
    last_error: str | None = None
    durations: list[float] = field(default_factory=list)


class EngineMonitor:
    def __init__(self, settings: SidecarSettings, client: httpx.AsyncClient | None = None) -> None:
        self.settings = settings
        self.client = client or httpx.AsyncClient(
            base_url=settings.engine_base, timeout=settings.scrape_timeout_s
        )
        self.windows: dict[SeriesKey, AcceptanceWindow] = {}
        self.probe = ProbeState(served_model=settings.served_model)
        self.scrapes = ScrapeCounters()
        self.dropped_series = 0
        self.verdict_listeners: list[VerdictListener] = []
        self._verdict: Verdict = Verdict.NO_DATA

    # -- one cycle ---------------------------------------------------------------------------
    async def run_once(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        started = time.perf_counter()
        health, metrics = await asyncio.gather(
            self._get("/health"), self._get("/metrics"), return_exceptions=False
        )
        self.probe.last_probe_at = now
        self.probe.health_ok = health is not None and health.status_code == 200
        if health is None:
            self.probe.health_detail = self.scrapes.last_error or "unreachable"
        else:
            self.probe.health_detail = f"/health answered {health.status_code}"
            if health.status_code != 200:
                self._count_error("http_status", f"/health answered {health.status_code}")
        self.probe.metrics_ok = False
        if metrics is not None and metrics.status_code == 200:
            self.ingest(metrics.text, now)
        elif metrics is not None:
            self._count_error("http_status", f"/metrics answered {metrics.status_code}")
        if self.probe.health_ok:
            await self._check_generation(now)
        self.scrapes.durations.append(time.perf_counter() - started)
        del self.scrapes.durations[:-256]
        self._update_verdict()

    def ingest(self, text: str, now: float) -> None:
        """Parse one exposition and advance the windows (the hot path the benchmark times)."""
        parsed = exposition.parse(text)
        if parsed.errors:
            self.scrapes.parse_errors += len(parsed.errors)
            log.warning(
                "malformed metrics lines (%d), first: %s", len(parsed.errors), parsed.errors[0]
            )
        if not parsed.is_vllm:
            self._count_error("not_vllm_metrics", "/metrics has no vllm: series")
            return
        self.scrapes.ok += 1
        self.probe.metrics_ok = True
        generation = 0.0
        running = 0.0
        for key, sample in parsed.series.items():
            generation += sample.generation_tokens
            running += sample.requests_running
            window = self.windows.get(key)
            if window is None:
                if len(self.windows) >= self.settings.max_series:
                    self.dropped_series += 1
                    continue
                window = self.windows[key] = AcceptanceWindow(self.settings.window_capacity)
            if window.add(Snapshot.of(now, sample)):
                log.info("counters of %s went back: engine restarted, window restarted", dict(key))
        last = self.probe.last_generation_tokens
        if last is not None and generation > last:
            self.probe.last_progress_at = now
        self.probe.last_generation_tokens = generation
        self.probe.requests_running = running

    async def _check_generation(self, now: float) -> None:
        """Prove the engine core generates: recent token progress, else a 1-token canary."""
        recent = self.probe.last_progress_at
        if recent is not None and now - recent < self.settings.canary_interval_s:
            self.probe.canary_failure = None
            return
        if now < self.probe.canary_due_at or self.probe.requests_running > 0:
            return
        self.probe.canary_due_at = now + self.settings.canary_interval_s
        try:
            model = self.probe.served_model or await self._served_model()
            reply = await self.client.post(
                "/v1/completions",
                json={"model": model, "prompt": "ping", "max_tokens": 1, "temperature": 0},
                timeout=self.settings.canary_timeout_s,
            )
            if reply.status_code != 200:
                raise RuntimeError(
                    f"canary completion answered {reply.status_code}: {reply.text[:200]}"
                )
            self.probe.last_progress_at = now
            self.probe.canary_failure = None
        except (httpx.HTTPError, RuntimeError, KeyError, ValueError) as err:
            self.probe.canary_failure = f"{type(err).__name__}: {err}"[:300]
            self._count_error("canary", self.probe.canary_failure)

    async def _served_model(self) -> str:
        reply = await self.client.get("/v1/models")
        reply.raise_for_status()
        model = str(reply.json()["data"][0]["id"])
        self.probe.served_model = model
        return model

    async def _get(self, path: str) -> httpx.Response | None:
        try:
            return await self.client.get(path)
        except httpx.TimeoutException:
            self._count_error(
                "timeout", f"GET {path} timed out after {self.settings.scrape_timeout_s}s"
            )
        except httpx.HTTPError as err:
            self._count_error("connect", f"GET {path}: {type(err).__name__}: {err}")
        return None

    def _count_error(self, kind: str, message: str) -> None:
        self.scrapes.errors[kind] += 1
        self.scrapes.last_error = message

    # -- readiness and stats -----------------------------------------------------------------
    def readiness(self, now: float | None = None) -> Readiness:
        now = time.monotonic() if now is None else now
        p, s = self.probe, self.settings
        fresh = p.last_probe_at is not None and now - p.last_probe_at <= 2 * s.scrape_interval_s
        progressing = p.last_progress_at is not None
        stalled = (
            p.requests_running > 0
            and p.last_progress_at is not None
            and now - p.last_progress_at > s.stall_timeout_s
        )
        checks = {
            "probe_fresh": fresh,
            "health": p.health_ok,
            "metrics": p.metrics_ok,
            "generating": progressing and p.canary_failure is None and not stalled,
        }
        if p.last_probe_at is None:
            reason = "no probe of the engine yet"
        elif not fresh:
            reason = f"last engine probe is {now - p.last_probe_at:.0f}s old (monitor stuck)"
        elif not p.health_ok:
            reason = f"engine not healthy: {p.health_detail}"
        elif not p.metrics_ok:
            reason = f"engine metrics unavailable: {self.scrapes.last_error}"
        elif p.canary_failure is not None:
            reason = f"engine answers /health but cannot generate: {p.canary_failure}"
        elif stalled:
            idle = now - (p.last_progress_at or now)
            reason = f"{p.requests_running:.0f} requests running, no tokens for {idle:.0f}s"
        elif not progressing:
            reason = "engine healthy, waiting for the first generated token"
        else:
            return Readiness(ready=True, reason="engine healthy and generating", checks=checks)
        return Readiness(ready=False, reason=reason, checks=checks)

    def _window_stats(self, delta: Delta | None, seconds: float) -> WindowStats:
        thresholds = self.settings.thresholds
        if delta is None or delta.seconds <= 0:
            verdict, reason = judge(0, None, [], thresholds)
            return WindowStats(
                window_seconds=seconds,
                span_seconds=None,
                drafts=0,
                mean_acceptance_length=None,
                draft_acceptance_rate=None,
                per_position_acceptance=[],
                output_tokens_per_s=None,
                drafts_per_s=None,
                verdict=verdict,
                verdict_reason=reason,
            )
        drafts = delta.drafts
        mal, rate, per_pos = acceptance_ratios(
            drafts, delta.draft_tokens, delta.accepted, list(delta.accepted_per_pos)
        )
        verdict, reason = judge(drafts, mal, per_pos, thresholds)
        return WindowStats(
            window_seconds=seconds,
            span_seconds=delta.seconds,
            drafts=drafts,
            mean_acceptance_length=mal,
            draft_acceptance_rate=rate,
            per_position_acceptance=per_pos,
            output_tokens_per_s=delta.generation_tokens / delta.seconds,
            drafts_per_s=drafts / delta.seconds,
            verdict=verdict,
            verdict_reason=reason,
        )

    def stats(self) -> StatsResponse:
        readiness = self.readiness()
        series = []
        totals: dict[str, Delta | None] = dict.fromkeys(self.settings.windows)
        for key, window in self.windows.items():
            per_window = {}
            for name, seconds in self.settings.windows.items():
                delta = window.delta(seconds)
                per_window[name] = self._window_stats(delta, seconds)
                if delta is not None:
                    total = totals[name]
                    totals[name] = delta if total is None else total + delta
            series.append(
                SeriesStats(labels=dict(key), windows=per_window, counter_resets=window.resets)
            )
        latest = self.probe.last_probe_at
        return StatsResponse(
            ready=readiness.ready,
            reason=readiness.reason,
            windows={
                name: self._window_stats(totals[name], seconds)
                for name, seconds in self.settings.windows.items()
            },
            series=series,
            scrape=ScrapeHealth(
                scrapes_ok=self.scrapes.ok,
                scrape_errors=dict(self.scrapes.errors),
                parse_errors=self.scrapes.parse_errors,
                last_error=self.scrapes.last_error,
                last_scrape_age_s=None if latest is None else time.monotonic() - latest,
            ),
        )

    def _total_delta(self, seconds: float) -> Delta | None:
        """All series' increase over the last `seconds`, summed."""
        total: Delta | None = None
        for window in self.windows.values():
            delta = window.delta(seconds)
            if delta is not None:
                total = delta if total is None else total + delta
        return total

    def _update_verdict(self) -> None:
        seconds = self.settings.windows[self.settings.verdict_window]
        stats = self._window_stats(self._total_delta(seconds), seconds)
        if stats.verdict != self._verdict:
            previous, self._verdict = self._verdict, stats.verdict
            for listener in self.verdict_listeners:
                listener(previous, stats.verdict, stats.verdict_reason)

    # -- lifecycle ---------------------------------------------------------------------------
    async def run_forever(self) -> None:
        interval = self.settings.scrape_interval_s
        while True:
            started = time.monotonic()
            try:
                await self.run_once(started)
            except Exception:  # the monitor must outlive any surprise from the engine
                log.exception("engine monitor cycle failed")
                self._count_error("internal", "monitor cycle failed; see the sidecar log")
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    async def aclose(self) -> None:
        await self.client.aclose()
