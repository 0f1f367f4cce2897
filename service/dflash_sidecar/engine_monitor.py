"""Background monitor of one vLLM engine: probes `/health` and `/metrics` on loopback, keeps the
acceptance windows, proves the engine can generate, and decides readiness and liveness.

Readiness needs more than `/health`: vLLM can answer 200 there while its engine core is dead. So
the monitor also requires token progress: either the engine's generation counter moved recently,
or a one-token canary completion succeeded (sent only while the engine is idle, at most once per
`canary_interval`); and while requests run, tokens must keep coming.

Nothing the engine sends can break the monitor: every probe has one total deadline, a page that
does not parse is counted and logged (rate-limited), an untrusted sample is dropped for that
scrape, and figures are only ever computed from trusted, fresh snapshots.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from dflash_sidecar import metrics_parser
from dflash_sidecar.acceptance_window import (
    AcceptanceWindow,
    Delta,
    SampleProblem,
    Snapshot,
    acceptance_ratios,
)
from dflash_sidecar.engine_state import EngineState, EngineStateTracker
from dflash_sidecar.log_limiter import LogLimiter
from dflash_sidecar.metrics_parser import SeriesKey
from dflash_sidecar.models import (
    EngineLiveness,
    Readiness,
    ScrapeHealth,
    SeriesStats,
    StatsResponse,
    WindowStats,
)
from dflash_sidecar.settings import SidecarSettings
from dflash_sidecar.verdict import Verdict, judge

log = logging.getLogger("dflash_sidecar")

VerdictListener = Callable[[Verdict, Verdict, str], None]
ERROR_KINDS = ("connect", "timeout", "http_status", "not_vllm_metrics", "canary", "internal")


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
    dropped_samples: Counter[str] = field(default_factory=Counter)
    last_error: str | None = None
    durations: list[float] = field(default_factory=list)


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
        self.verdict_listeners: list[VerdictListener] = []
        self._verdict: Verdict = Verdict.NO_DATA
        self.started_at = time.monotonic() if started_at is None else started_at
        self.started_at_unix = time.time()
        self.engine = EngineStateTracker(self.started_at, settings.startup_budget)
        self.logs = LogLimiter(log)

    # -- one cycle ---------------------------------------------------------------------------
    async def run_once(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        started = time.perf_counter()
        (health, health_error), (metrics, _) = await asyncio.gather(
            self._get("/health"), self._get("/metrics")
        )
        self.probe.last_probe_at = now
        self.probe.health_ok = health is not None and health.status_code == 200
        if health is None:
            self.probe.health_detail = health_error or "GET /health failed"
        else:
            self.probe.health_detail = f"GET /health answered {health.status_code}"
            if health.status_code != 200:
                self._count_error("http_status", f"GET /health answered {health.status_code}")
        self.probe.metrics_ok = False
        if metrics is not None and metrics.status_code == 200:
            self.ingest(metrics.text, now)
        elif metrics is not None:
            self._count_error("http_status", f"GET /metrics answered {metrics.status_code}")
        if self.probe.health_ok:
            await self._check_generation(now)
        self.engine.update(now, self.probe.health_ok, self._generating(now))
        self.scrapes.durations.append(time.perf_counter() - started)
        del self.scrapes.durations[:-256]
        self._update_verdict(now)

    def ingest(self, text: str, now: float) -> None:
        """Parse one exposition and advance the windows (the hot path the benchmark times)."""
        parsed = metrics_parser.parse(text)
        if parsed.errors:
            self.scrapes.parse_errors += len(parsed.errors)
            self.logs.log(
                logging.WARNING,
                "parse",
                "malformed lines in the engine's /metrics (%d), first: %s",
                len(parsed.errors),
                parsed.errors[0],
            )
        if not parsed.is_vllm:
            self._count_error("not_vllm_metrics", "GET /metrics returned no vllm: series")
            self.logs.log(
                logging.WARNING, "not_vllm", "the engine's /metrics is not vLLM's: %r", text[:120]
            )
            return
        self.scrapes.ok += 1
        self.probe.metrics_ok = True
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
            window = self.windows.get(key)
            if window is None:
                if len(self.windows) >= self.settings.max_series:
                    self.dropped_series += 1
                    continue
                window = self.windows[key] = AcceptanceWindow(self.settings.window_capacity)
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

    async def _check_generation(self, now: float) -> None:
        """Prove the engine core generates: recent token progress, else a 1-token canary."""
        recent = self.probe.last_progress_at
        if recent is not None and now - recent < self.settings.canary_interval:
            self.probe.canary_failure = None
            return
        if now < self.probe.canary_due_at or self.probe.requests_running > 0:
            return
        self.probe.canary_due_at = now + self.settings.canary_interval
        try:
            async with asyncio.timeout(self.settings.canary_timeout):
                model = self.probe.served_model or await self._served_model()
                reply = await self.client.post(
                    "/v1/completions",
                    json={"model": model, "prompt": "ping", "max_tokens": 1, "temperature": 0},
                    headers=self._auth_headers(),
                    timeout=self.settings.canary_timeout,
                )
            if reply.status_code != 200:
                raise RuntimeError(self._refusal("canary completion", reply))
            self.probe.last_progress_at = now
            self.probe.canary_failure = None
        except TimeoutError:
            self.probe.canary_failure = (
                f"canary completion timed out after {self.settings.canary_timeout:g}s"
            )
            self._count_error("canary", self.probe.canary_failure)
        except (httpx.HTTPError, RuntimeError, KeyError, IndexError, TypeError, ValueError) as err:
            self.probe.canary_failure = f"{type(err).__name__}: {err}"[:300]
            self._count_error("canary", self.probe.canary_failure)

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
        return f"{what} answered {reply.status_code}: {reply.text[:200]}"

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

    def _count_error(self, kind: str, message: str) -> None:
        self.scrapes.errors[kind] += 1
        self.scrapes.last_error = message

    # -- readiness, liveness and stats -------------------------------------------------------
    def _stale_after(self) -> float:
        """Age beyond which a snapshot no longer describes the engine."""
        return 2 * self.settings.scrape_interval + self.settings.scrape_timeout

    def _stalled(self, now: float) -> bool:
        p = self.probe
        return (
            p.requests_running > 0
            and p.last_progress_at is not None
            and now - p.last_progress_at > self.settings.stall_timeout
        )

    def _generating(self, now: float) -> bool:
        p = self.probe
        return (
            p.last_progress_at is not None and p.canary_failure is None and not self._stalled(now)
        )

    def readiness(self, now: float | None = None) -> Readiness:
        now = time.monotonic() if now is None else now
        p, s = self.probe, self.settings
        fresh = p.last_probe_at is not None and now - p.last_probe_at <= 2 * s.scrape_interval
        state = self.engine.state
        checks = {
            "probe_fresh": fresh,
            "health": p.health_ok,
            "metrics": p.metrics_ok,
            "generating": self._generating(now),
        }
        waited = self.engine.seconds_in_state(now)
        if p.last_probe_at is None:
            reason = "no probe of the engine yet"
        elif not fresh:
            reason = f"last engine probe is {now - p.last_probe_at:.0f}s old (monitor stuck)"
        elif state is EngineState.STARTING:
            reason = (
                f"engine loading: no answer from /health yet ({p.health_detail}); "
                f"{now - self.engine.started_at:.0f}s of the {s.startup_budget:.0f}s "
                "startup budget"
            )
        elif state is EngineState.START_TIMEOUT:
            reason = (
                f"engine did not come up within the {s.startup_budget:.0f}s startup budget: "
                f"{p.health_detail}"
            )
        elif not p.health_ok:
            reason = f"engine down for {waited:.0f}s: {p.health_detail}"
        elif not p.metrics_ok:
            reason = f"engine metrics unavailable: {self.scrapes.last_error}"
        elif p.canary_failure is not None:
            reason = f"engine answers /health but cannot generate: {p.canary_failure}"
        elif self._stalled(now):
            idle = now - (p.last_progress_at or now)
            reason = f"{p.requests_running:.0f} requests running, no tokens for {idle:.0f}s"
        elif p.last_progress_at is None:
            reason = "engine healthy, waiting for the first generated token"
        else:
            return Readiness(
                ready=True, reason="engine healthy and generating", state=state, checks=checks
            )
        return Readiness(ready=False, reason=reason, state=state, checks=checks)

    def liveness(self, now: float | None = None) -> EngineLiveness:
        """Whether the kubelet should restart the engine: only on a long, proven failure."""
        now = time.monotonic() if now is None else now
        state, s = self.engine.state, self.settings
        seconds = self.engine.seconds_in_state(now)
        fresh = (
            self.probe.last_probe_at is not None
            and now - self.probe.last_probe_at <= 2 * s.scrape_interval + s.scrape_timeout
        )
        if fresh and state is EngineState.DOWN and seconds >= s.engine_down_grace:
            return EngineLiveness(
                alive=False,
                state=state,
                reason=f"/health has failed for {seconds:.0f}s: {self.probe.health_detail}",
            )
        if fresh and state is EngineState.NOT_GENERATING and seconds >= s.not_generating_grace:
            return EngineLiveness(
                alive=False,
                state=state,
                reason=f"engine answers /health but has not generated for {seconds:.0f}s",
            )
        return EngineLiveness(alive=True, state=state, reason=f"{state.value} for {seconds:.0f}s")

    def _window_stats(self, delta: Delta | None, seconds: float, why_none: str) -> WindowStats:
        thresholds = self.settings.thresholds
        impossible = delta.impossible() if delta is not None and delta.seconds > 0 else None
        if delta is None or delta.seconds <= 0 or impossible is not None:
            reason = why_none if impossible is None else f"figures withheld: {impossible}"
            return WindowStats(
                window_seconds=seconds,
                span_seconds=None,
                drafts=0,
                mean_acceptance_length=None,
                draft_acceptance_rate=None,
                per_position_acceptance=[],
                output_tokens_per_s=None,
                drafts_per_s=None,
                verdict=Verdict.NO_DATA,
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

    def _why_no_window(self, now: float) -> str:
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

    def stats(self, now: float | None = None) -> StatsResponse:
        now = time.monotonic() if now is None else now
        readiness = self.readiness(now)
        why = self._why_no_window(now)
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
        latest = self.probe.last_probe_at
        return StatsResponse(
            ready=readiness.ready,
            reason=readiness.reason,
            engine_state=self.engine.state,
            windows={
                name: self._window_stats(self._total_delta(seconds, now), seconds, why)
                for name, seconds in self.settings.windows.items()
            },
            series=series,
            scrape=ScrapeHealth(
                scrapes_ok=self.scrapes.ok,
                scrape_errors=dict(self.scrapes.errors),
                parse_errors=self.scrapes.parse_errors,
                dropped_samples=dict(self.scrapes.dropped_samples),
                last_error=self.scrapes.last_error,
                last_scrape_age_s=None if latest is None else max(0.0, now - latest),
            ),
        )

    def _update_verdict(self, now: float) -> None:
        seconds = self.settings.windows[self.settings.verdict_window]
        stats = self._window_stats(
            self._total_delta(seconds, now), seconds, self._why_no_window(now)
        )
        if stats.verdict != self._verdict:
            previous, self._verdict = self._verdict, stats.verdict
            for listener in self.verdict_listeners:
                listener(previous, stats.verdict, stats.verdict_reason)

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
        await self.client.aclose()
