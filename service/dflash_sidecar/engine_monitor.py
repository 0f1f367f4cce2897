"""Background monitor of one vLLM engine: probes `/health` and `/metrics` on loopback, keeps the
acceptance windows, proves the engine can generate, and decides readiness and liveness.

Readiness follows the engine's ability to serve: `/health` 200 (vLLM can answer it while its
engine core is dead, so also) proof of generation: the engine's generation counter moved
recently, or a one-token canary completion succeeded (sent while the engine is idle or its
metrics are unreadable, at most once per `canary_interval`, beside the probe loop so a slow
canary never holds the probes); and while requests run, tokens must keep coming. A slow or
failed `/metrics` read alone never makes the engine unready: it is counted and reported.

Nothing the engine sends can block or break the monitor: every probe has one total deadline,
`/metrics` is read up to `max_page_bytes` and parsed off the event loop (the endpoints keep
answering while a large page is parsed), a page that does not parse is counted and logged
(rate-limited, values cut short), an untrusted sample is dropped for that scrape, and figures
are computed once per scrape from trusted, fresh snapshots; every endpoint serves those.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from itertools import chain

import httpx

from dflash_sidecar import decisions, metrics_parser
from dflash_sidecar.acceptance_window import (
    AcceptanceWindow,
    Delta,
    SampleProblem,
    Snapshot,
)
from dflash_sidecar.decisions import ProbeState
from dflash_sidecar.engine_state import EngineStateTracker
from dflash_sidecar.log_limiter import LogLimiter
from dflash_sidecar.metrics_parser import ParsedExposition, SeriesKey
from dflash_sidecar.models import (
    EngineLiveness,
    Readiness,
    ScrapeHealth,
    SeriesStats,
    StatsResponse,
    WindowStats,
)
from dflash_sidecar.recommendation import (
    Recommendation,
    RunningBatchSamples,
    busy_tokens_per_s,
    per_position_at_k_in_effect,
    recommend,
)
from dflash_sidecar.settings import SidecarSettings
from dflash_sidecar.verdict import Verdict

log = logging.getLogger("dflash_sidecar")

VerdictListener = Callable[[Verdict, Verdict, str], Awaitable[None] | None]
ERROR_KINDS = (
    "connect",
    "timeout",
    "http_status",
    "not_vllm_metrics",
    "page_too_large",
    "canary",
    "internal",
)


class PageTooLarge(Exception):
    pass


@dataclass
class ScrapeCounters:
    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    parse_errors: int = 0
    dropped_samples: Counter[str] = field(default_factory=Counter)
    last_error: str | None = None
    durations: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Figures:
    """The window figures of one scrape, which every endpoint serves until the next."""

    at: float
    windows: dict[str, WindowStats]
    series: list[SeriesStats]


class EngineMonitor:
    def __init__(
        self,
        settings: SidecarSettings,
        client: httpx.AsyncClient | None = None,
        started_at: float | None = None,
    ) -> None:
        self.settings = settings
        self.client = client or httpx.AsyncClient(
            base_url=settings.engine_base, timeout=settings.scrape_timeout
        )
        self.windows: dict[SeriesKey, AcceptanceWindow] = {}
        self.probe = ProbeState(served_model=settings.served_model)
        self.scrapes = ScrapeCounters()
        self.dropped_series = 0
        self.evicted_series = 0
        self.listener_failures = 0
        self.verdict_listeners: list[VerdictListener] = []
        self._verdict: Verdict = Verdict.NO_DATA
        self.started_at = time.monotonic() if started_at is None else started_at
        self.started_at_unix = time.time()
        self.engine = EngineStateTracker(self.started_at, settings.startup_budget)
        self.logs = LogLimiter(log)
        self._canary: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._figures: Figures | None = None
        self._longest_window = max(settings.windows.items(), key=lambda item: item[1])
        self.batches = RunningBatchSamples(self._longest_window[1])
        self._running_schedule = settings.running_schedule()
        self._recommendation: Recommendation | None = None

    # -- one cycle ---------------------------------------------------------------------------
    async def run_once(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        started = time.perf_counter()
        (health, health_error), (page, page_error) = await asyncio.gather(
            self._get("/health"), self._get_metrics()
        )
        if page_error is not None:
            self.probe.metrics_detail = page_error
        self.probe.last_probe_at = now
        self.probe.health_ok = health is not None and health.status_code == 200
        if health is None:
            self.probe.health_detail = health_error or "GET /health failed"
        else:
            self.probe.health_detail = f"GET /health answered {health.status_code}"
            if health.status_code != 200:
                self._count_error("http_status", f"GET /health answered {health.status_code}")
        self.probe.metrics_ok = False
        if page is not None:
            try:
                parsed = await asyncio.to_thread(
                    metrics_parser.parse, page, self.settings.max_page_series
                )
            except Exception as err:  # a parser bug must not stop the probes
                self._count_error("internal", f"parsing /metrics failed: {type(err).__name__}")
                self.logs.log(logging.ERROR, "parse-bug", "parsing /metrics failed", exc_info=True)
            else:
                self.apply(parsed, page[:120], now)
        if self.probe.metrics_ok:
            self.probe.metrics_failing_since = None
        else:
            self.probe.requests_running = None
            if self.probe.metrics_failing_since is None:
                self.probe.metrics_failing_since = now
        if self.probe.health_ok:
            self._check_generation(now)
        self.engine.update(now, self.probe.health_ok, self._generating(now))
        self.scrapes.durations.append(time.perf_counter() - started)
        del self.scrapes.durations[:-256]
        self._figures = self._compute_figures(now)
        self._recommendation = self._recommend(now, self._figures.windows[self._longest_window[0]])
        self._update_verdict()

    def ingest(self, text: str, now: float) -> None:
        """Parse one exposition and advance the windows (what the benchmark times)."""
        self.apply(metrics_parser.parse(text, self.settings.max_page_series), text[:120], now)

    def apply(self, parsed: ParsedExposition, head: str, now: float) -> None:
        """Advance the windows with one parsed exposition."""
        if parsed.errors:
            self.scrapes.parse_errors += parsed.error_count
            self.logs.log(
                logging.WARNING,
                "parse",
                "malformed lines in the engine's /metrics (%d), first: %s",
                parsed.error_count,
                parsed.errors[0],
            )
        if not parsed.is_vllm:
            self.probe.metrics_detail = "GET /metrics returned no vllm: series"
            self._count_error("not_vllm_metrics", self.probe.metrics_detail)
            self.logs.log(
                logging.WARNING, "not_vllm", "the engine's /metrics is not vLLM's: %r", head
            )
            return
        self.scrapes.ok += 1
        self.probe.metrics_ok = True
        if parsed.overflow:
            self.dropped_series += parsed.overflow
        generation: float | None = 0.0
        running = 0.0
        for key, sample in parsed.series.items():
            running += sample.requests_running
            snapshot = Snapshot.of(now, sample)
            if isinstance(snapshot, SampleProblem):
                self._drop(key, snapshot, "; ".join(sample.problems) or "a counter is missing")
                generation = None
                continue
            if generation is not None:
                generation += snapshot.generation_tokens
            window = self._window_for(key, now)
            if window is None:
                continue
            outcome = window.add(snapshot)
            if isinstance(outcome, SampleProblem):
                self._drop(key, outcome, "a counter went back while the engine kept running")
                generation = None
            elif outcome:
                log.info("counters of %s went back: engine restarted, window restarted", dict(key))
        last = self.probe.last_generation_tokens
        if generation is not None:
            if last is not None and generation > last:
                self.probe.last_progress_at = now
            self.probe.last_generation_tokens = generation
        self.probe.requests_running = running
        self.batches.add(now, running)

    def _window_for(self, key: SeriesKey, now: float) -> AcceptanceWindow | None:
        """The window of a series; a new series takes the slot of the one unseen for longest,
        once that one has not been seen for the longest window (else it is not tracked)."""
        window = self.windows.get(key)
        if window is not None:
            return window
        if len(self.windows) >= self.settings.max_series:
            longest = max(self.settings.windows.values())
            oldest_key, oldest = min(
                self.windows.items(),
                key=lambda item: item[1].latest.at if item[1].latest else float("-inf"),
            )
            last_seen = oldest.latest.at if oldest.latest else float("-inf")
            if now - last_seen <= longest:
                self.dropped_series += 1
                return None
            del self.windows[oldest_key]
            self.evicted_series += 1
        window = self.windows[key] = AcceptanceWindow(self.settings.window_capacity)
        return window

    def _drop(self, key: SeriesKey, problem: SampleProblem, detail: str) -> None:
        self.scrapes.dropped_samples[problem.value] += 1
        self.logs.log(
            logging.WARNING,
            f"drop:{problem.value}",
            "dropped the sample of %s for this scrape (%s): %s",
            dict(key),
            problem.value,
            detail,
        )

    # -- the canary, beside the probe loop ----------------------------------------------------
    def _check_generation(self, now: float) -> None:
        """Prove the engine core generates: recent token progress, else a 1-token canary,
        started beside the loop while the engine is idle (or its load unknown)."""
        recent = self.probe.last_progress_at
        if recent is not None and now - recent < self.settings.canary_interval:
            self.probe.canary_failure = None
            return
        busy = self.probe.requests_running is not None and self.probe.requests_running > 0
        if now < self.probe.canary_due_at or busy:
            return
        if self._canary is not None and not self._canary.done():
            return
        self.probe.canary_due_at = now + self.settings.canary_interval
        self._canary = asyncio.get_running_loop().create_task(self._run_canary(now), name="canary")

    async def settle(self) -> None:
        """Wait for the canary and the listeners in flight (tests, shutdown)."""
        pending = [t for t in (self._canary, *self._background) if t is not None and not t.done()]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def _run_canary(self, started: float) -> None:
        timeout = self.settings.canary_timeout
        try:
            async with asyncio.timeout(timeout):
                model = self.probe.served_model or await self._served_model()
                reply = await self.client.post(
                    "/v1/completions",
                    json={"model": model, "prompt": "ping", "max_tokens": 1, "temperature": 0},
                    headers=self._auth_headers(),
                    timeout=timeout,
                )
            if reply.status_code != 200:
                raise RuntimeError(self._refusal("canary completion", reply))
            latest = self.probe.last_progress_at
            self.probe.last_progress_at = started if latest is None else max(latest, started)
            self.probe.canary_failure = None
        except (TimeoutError, httpx.TimeoutException):
            # A busy engine answers late: that is not a failure yet; no proof of generation for
            # stall_timeout is (see _generating).
            self._count_error("canary", f"canary completion timed out after {timeout:g}s")
        except (httpx.HTTPError, RuntimeError, KeyError, IndexError, TypeError, ValueError) as err:
            self.probe.canary_failure = f"{type(err).__name__}: {err}"[:300]
            self._count_error("canary", self.probe.canary_failure)
        # The verdict of the canary counts now, not at the next probe.
        at = max(started, self.engine.since)
        self.engine.update(at, self.probe.health_ok, self._generating(at))

    async def _served_model(self) -> str:
        reply = await self.client.get("/v1/models", headers=self._auth_headers())
        if reply.status_code != 200:
            raise RuntimeError(self._refusal("GET /v1/models", reply))
        model = str(reply.json()["data"][0]["id"])
        self.probe.served_model = model
        return model

    def _auth_headers(self) -> dict[str, str]:
        """The bearer token for the routes vLLM guards with --api-key (/v1/...)."""
        key = self.settings.api_key
        return {"Authorization": f"Bearer {key.get_secret_value()}"} if key else {}

    def _refusal(self, what: str, reply: httpx.Response) -> str:
        if reply.status_code == 401:
            fix = (
                "the sidecar's VLLM_API_KEY is not the engine's key"
                if self.settings.api_key
                else "the engine requires an API key: give the sidecar the engine's key in "
                "VLLM_API_KEY (chart: auth.apiKeySecret)"
            )
            return f"{what} answered 401 Unauthorized: {fix}"
        return f"{what} answered {reply.status_code}: {reply.text[:200]!r}"

    # -- HTTP --------------------------------------------------------------------------------
    async def _get(self, path: str) -> tuple[httpx.Response | None, str | None]:
        """GET with one total deadline (a server that trickles bytes cannot hold the probe):
        the response, or None and what went wrong."""
        timeout = self.settings.scrape_timeout
        try:
            async with asyncio.timeout(timeout):
                return await self.client.get(path), None
        except (TimeoutError, httpx.TimeoutException):
            kind, message = "timeout", f"GET {path} timed out after {timeout:g}s"
        except httpx.HTTPError as err:
            kind, message = "connect", f"GET {path}: {type(err).__name__}: {err}"[:300]
        self._count_error(kind, message)
        return None, message

    async def _get_metrics(self) -> tuple[str | None, str | None]:
        """The /metrics page as text, read up to max_page_bytes within the probe deadline."""
        timeout, limit = self.settings.scrape_timeout, self.settings.max_page_bytes
        try:
            async with asyncio.timeout(timeout):
                async with self.client.stream("GET", "/metrics") as reply:
                    if reply.status_code != 200:
                        message = f"GET /metrics answered {reply.status_code}"
                        self._count_error("http_status", message)
                        return None, message
                    body = bytearray()
                    async for chunk in reply.aiter_bytes():
                        if len(body) + len(chunk) > limit:
                            raise PageTooLarge
                        body += chunk
            return body.decode("utf-8", errors="replace"), None
        except PageTooLarge:
            kind = "page_too_large"
            message = (
                f"GET /metrics: the page is larger than {limit} bytes (--max-page-bytes); not read"
            )
        except (TimeoutError, httpx.TimeoutException):
            kind, message = "timeout", f"GET /metrics timed out after {timeout:g}s"
        except httpx.HTTPError as err:
            kind, message = "connect", f"GET /metrics: {type(err).__name__}: {err}"[:300]
        self._count_error(kind, message)
        return None, message

    def _count_error(self, kind: str, message: str) -> None:
        self.scrapes.errors[kind] += 1
        self.scrapes.last_error = message

    # -- readiness, liveness and stats (the rules: dflash_sidecar.decisions) ----------------
    def _stale_after(self) -> float:
        return decisions.stale_after(self.settings)

    def _generating(self, now: float) -> bool:
        return decisions.generating(self.probe, self.settings, now)

    def readiness(self, now: float | None = None) -> Readiness:
        now = time.monotonic() if now is None else now
        return decisions.readiness(self.probe, self.engine, self.settings, now)

    def liveness(self, now: float | None = None) -> EngineLiveness:
        """Whether the kubelet should restart the engine: only on a long, proven failure."""
        now = time.monotonic() if now is None else now
        return decisions.liveness(self.probe, self.engine, self.settings, now)

    def _window_stats(self, delta: Delta | None, seconds: float, why_none: str) -> WindowStats:
        return decisions.window_stats(delta, seconds, why_none, self.settings)

    def _why_no_window(self) -> str:
        if not self.probe.health_ok or not self.probe.metrics_ok:
            return f"no data: the engine is {self.engine.state.value.replace('_', ' ')}"
        return "no data: fewer than two fresh snapshots in the window"

    def _total_delta(self, seconds: float, now: float) -> Delta | None:
        """All series' increase over the last `seconds`, summed."""
        total: Delta | None = None
        for window in self.windows.values():
            delta = window.delta(seconds, now, self._stale_after())
            if delta is not None:
                total = delta if total is None else total + delta
        return total

    def _compute_figures(self, now: float) -> Figures:
        why = self._why_no_window()
        stale_after = self._stale_after()
        series = []
        for key, window in self.windows.items():
            per_window = {
                name: self._window_stats(window.delta(seconds, now, stale_after), seconds, why)
                for name, seconds in self.settings.windows.items()
            }
            series.append(
                SeriesStats(labels=dict(key), windows=per_window, counter_resets=window.resets)
            )
        windows = {
            name: self._window_stats(self._total_delta(seconds, now), seconds, why)
            for name, seconds in self.settings.windows.items()
        }
        return Figures(at=now, windows=windows, series=series)

    def figures(self) -> Figures:
        """The figures of the last scrape (computed then; an endpoint never recomputes)."""
        if self._figures is None:
            self._figures = self._compute_figures(time.monotonic())
        return self._figures

    def recommendation(self, now: float | None = None, window: str | None = None) -> Recommendation:
        """The schedule the traffic of the longest window (or of `window`, one of --windows)
        asks for (recommendation.py), as the last scrape computed it; with `now`, computed for
        that time (what ingest, which computes no figures, is read with)."""
        name = self._longest_window[0] if window is None else window
        seconds = self.settings.windows[name]
        if now is None and self._figures is not None:
            if name == self._longest_window[0] and self._recommendation is not None:
                return self._recommendation
            return self._recommend(self._figures.at, self._figures.windows[name], name)
        now = time.monotonic() if now is None else now
        return self._recommend(
            now, self._window_stats(self._total_delta(seconds, now), seconds, ""), name
        )

    def _recommend(
        self, now: float, stats: WindowStats, window: str | None = None
    ) -> Recommendation:
        name = self._longest_window[0] if window is None else window
        seconds = self.settings.windows[name]
        baseline = self.settings.baseline
        largest_k = self.settings.speculative_tokens or 0
        step_cost = baseline.step_cost if baseline else None
        per_position, reached = stats.per_position_acceptance, None
        lowered = 0 < len(per_position) < largest_k  # a schedule lowered k in the window
        # Each series' scrape intervals, built once, only where something reads them: the
        # per-position count under a schedule, and the busy throughput the step cost is judged by.
        stale_after = self._stale_after()
        intervals = (
            [series.intervals(seconds, now, stale_after) for series in self.windows.values()]
            if lowered or step_cost is not None
            else []
        )
        if lowered:  # count each k's scrapes
            running = self._running_schedule or ((1, 1, largest_k),)
            per_position, reached = per_position_at_k_in_effect(
                chain.from_iterable(intervals), {k for _, _, k in running}
            )
        return recommend(
            step_cost,
            per_position,
            stats.drafts,
            largest_k,
            self.batches.share(now, seconds),
            name,
            f"{baseline.sampling}; {baseline.workload}" if baseline else "",
            self._running_schedule,
            reached,
            busy_tokens_per_s(intervals),
        )

    def stats(self, now: float | None = None) -> StatsResponse:
        now = time.monotonic() if now is None else now
        readiness = self.readiness(now)
        figures = self.figures()
        latest = self.probe.last_probe_at
        return StatsResponse(
            ready=readiness.ready,
            reason=readiness.reason,
            engine_state=self.engine.state,
            windows=figures.windows,
            series=figures.series,
            scrape=ScrapeHealth(
                scrapes_ok=self.scrapes.ok,
                scrape_errors=dict(self.scrapes.errors),
                parse_errors=self.scrapes.parse_errors,
                dropped_samples=dict(self.scrapes.dropped_samples),
                last_error=self.scrapes.last_error,
                last_scrape_age_s=None if latest is None else max(0.0, now - latest),
            ),
            baseline=self.settings.baseline,
        )

    def _update_verdict(self) -> None:
        stats = self.figures().windows[self.settings.verdict_window]
        if stats.verdict == self._verdict:
            return
        previous, self._verdict = self._verdict, stats.verdict
        for listener in self.verdict_listeners:
            try:
                result = listener(previous, stats.verdict, stats.verdict_reason)
            except Exception:  # a listener must not take the monitor down
                self.listener_failures += 1
                self.logs.log(logging.ERROR, "listener", "verdict listener failed", exc_info=True)
                continue
            if inspect.isawaitable(result):
                task = asyncio.get_running_loop().create_task(self._guard(result))
                self._background.add(task)
                task.add_done_callback(self._background.discard)

    async def _guard(self, work: Awaitable[None]) -> None:
        try:
            await work
        except Exception:
            self.listener_failures += 1
            self.logs.log(logging.ERROR, "listener", "verdict listener failed", exc_info=True)

    # -- lifecycle ---------------------------------------------------------------------------
    async def run_forever(self) -> None:
        interval = self.settings.scrape_interval
        while True:
            started = time.monotonic()
            try:
                await self.run_once(started)
            except Exception:  # the monitor must outlive any surprise from the engine
                self.logs.log(
                    logging.ERROR, "internal", "engine monitor cycle failed", exc_info=True
                )
                self._count_error("internal", "monitor cycle failed; see the sidecar log")
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    async def aclose(self) -> None:
        tasks = [t for t in (self._canary, *self._background) if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.client.aclose()
