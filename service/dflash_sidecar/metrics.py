"""The sidecar's own Prometheus series (prefix `dflash_`), built from the monitor on scrape.

The engine-state series come first and do not depend on the acceptance windows: whatever the
engine sent, `dflash_engine_ready`, `dflash_engine_up` and `dflash_engine_state` are exported.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dflash_sidecar.engine_monitor import ERROR_KINDS, EngineMonitor
from dflash_sidecar.engine_state import EngineState
from dflash_sidecar.log_limiter import LogLimiter
from dflash_sidecar.models import WindowStats
from dflash_sidecar.recommendation import STEP_COST_DRIFT
from dflash_sidecar.verdict import VERDICT_CODES, Verdict

log = logging.getLogger("dflash_sidecar")


class SidecarCollector(Collector):
    def __init__(self, monitor: EngineMonitor) -> None:
        self.monitor = monitor
        self.logs = LogLimiter(log)

    def collect(self) -> Iterator[Metric]:
        yield from self._engine()
        yield from self._scrape_health()
        try:
            families = list(self._acceptance()) + list(self._schedule())
        except Exception:  # never lose the engine series above to a bug in the figures
            self.logs.log(logging.ERROR, "collect", "acceptance metrics failed", exc_info=True)
            families = []
        yield from families

    def _schedule(self) -> Iterator[Metric]:
        """The schedule recommendation (recommendation.py): whether one is available, the
        predicted gain over the running schedule and the recommended k per batch range."""
        advice = self.monitor.recommendation()
        available = GaugeMetricFamily(
            "dflash_schedule_recommendation_available",
            "1 when the sidecar has a step-cost model and enough live figures to recommend a k "
            "schedule (GET /recommendation says why not).",
        )
        available.add_metric([], 1.0 if advice.available else 0.0)
        yield available
        if not advice.available or advice.predicted_gain is None:
            return
        gain = GaugeMetricFamily(
            "dflash_schedule_predicted_gain",
            "Predicted output throughput of the recommended k schedule over the running one, "
            "minus 1, at the batch sizes the longest window ran.",
        )
        gain.add_metric([], advice.predicted_gain)
        yield gain
        tokens = GaugeMetricFamily(
            "dflash_schedule_predicted_tokens_per_second",
            "Predicted output tokens/s of the running and the recommended schedule.",
            labels=["schedule"],
        )
        for name, value in (advice.predicted_tokens_per_s or {}).items():
            tokens.add_metric([name], value)
        yield tokens
        if advice.evidence.step_cost_ratio is not None:
            ratio = GaugeMetricFamily(
                "dflash_schedule_step_cost_ratio",
                "The engine's output tokens/s while generating over the step cost's prediction "
                f"for the running schedule (beyond 1 +/- {STEP_COST_DRIFT} the step cost has "
                "drifted: the predictions are scaled by it; refit with bench sweep).",
            )
            ratio.add_metric([], advice.evidence.step_cost_ratio)
            yield ratio
        ks = GaugeMetricFamily(
            "dflash_schedule_recommended_k",
            "The recommended k for running batch sizes first..last (last 65536: open).",
            labels=["first", "last"],
        )
        for part in (advice.schedule or "").split(","):
            bounds, k = part.split(":")
            first, last = bounds.split("-")
            ks.add_metric([first, last or "65536"], float(k))
        yield ks

    def _engine(self) -> Iterator[Metric]:
        monitor = self.monitor
        readiness = monitor.readiness()
        ready = GaugeMetricFamily(
            "dflash_engine_ready",
            "1 when the sidecar finds the engine ready (healthy, generating).",
        )
        ready.add_metric([], 1.0 if readiness.ready else 0.0)
        yield ready
        up = GaugeMetricFamily("dflash_engine_up", "1 when the engine's /health answered 200.")
        up.add_metric([], 1.0 if monitor.probe.health_ok else 0.0)
        yield up
        state = GaugeMetricFamily(
            "dflash_engine_state",
            "1 for the engine's current state: starting (loading, within the startup budget), "
            "start_timeout, serving, not_generating (/health 200 without generation), down "
            "(served before, /health fails now).",
            labels=["state"],
        )
        for value in EngineState:
            state.add_metric([value.value], 1.0 if value is monitor.engine.state else 0.0)
        yield state
        seconds = GaugeMetricFamily(
            "dflash_engine_state_seconds", "Seconds the engine has been in its current state."
        )
        seconds.add_metric([], monitor.engine.seconds_in_state(time.monotonic()))
        yield seconds
        budget = GaugeMetricFamily(
            "dflash_engine_startup_budget_seconds",
            "Seconds an engine may take to load before it counts as failed to start.",
        )
        budget.add_metric([], monitor.settings.startup_budget)
        yield budget
        thresholds = GaugeMetricFamily(
            "dflash_verdict_threshold",
            "The sidecar's verdict thresholds (its settings), which the acceptance alerts "
            "compare against: collapsed_* and degraded_* mean acceptance length and position-0 "
            "acceptance, min_drafts.",
            labels=["threshold"],
        )
        for name, value in monitor.settings.thresholds.model_dump().items():
            thresholds.add_metric([name], float(value))
        yield thresholds
        if (baseline := monitor.settings.baseline) is not None:
            info = GaugeMetricFamily(
                "dflash_verdict_baseline_info",
                "The baseline the verdict thresholds are fractions of: the model, k and sampling "
                "it was measured on, and where (1 while it is in force; absent: the constants).",
                labels=["model", "k", "sampling", "source"],
            )
            info.add_metric(
                [baseline.model, str(baseline.num_speculative_tokens), baseline.sampling,
                 baseline.source],
                1.0,
            )  # fmt: skip
            yield info
        if monitor.settings.speculative_tokens is not None:
            k = GaugeMetricFamily(
                "dflash_speculative_tokens",
                "num_speculative_tokens of the engine (the sidecar's speculative_tokens): the "
                "largest k; under a k schedule the collapse alert scales its threshold by the "
                "share of it in effect.",
            )
            k.add_metric([], float(monitor.settings.speculative_tokens))
            yield k
        started = GaugeMetricFamily(
            "dflash_sidecar_start_time_seconds", "Unix time the sidecar started watching."
        )
        started.add_metric([], monitor.started_at_unix)
        yield started

    def _scrape_health(self) -> Iterator[Metric]:
        monitor = self.monitor
        scrapes = CounterMetricFamily("dflash_scrapes", "Engine /metrics pages read.")
        scrapes.add_metric([], monitor.scrapes.ok)
        yield scrapes
        errors = CounterMetricFamily(
            "dflash_scrape_errors",
            "Failed engine probes by kind (connect, timeout, http_status, not_vllm_metrics, "
            "page_too_large, canary, internal).",
            labels=["kind"],
        )
        for kind in ERROR_KINDS:
            errors.add_metric([kind], monitor.scrapes.errors.get(kind, 0))
        yield errors
        parse = CounterMetricFamily(
            "dflash_parse_errors", "Unparsable lines of the families the sidecar reads."
        )
        parse.add_metric([], monitor.scrapes.parse_errors)
        yield parse
        dropped = CounterMetricFamily(
            "dflash_dropped_samples",
            "Engine samples not used for a scrape, by reason: untrusted (NaN, infinite, "
            "negative or duplicated counter), incomplete (a counter missing), inconsistent "
            "(a counter went back without an engine restart).",
            labels=["reason"],
        )
        for reason in ("untrusted", "incomplete", "inconsistent"):
            dropped.add_metric([reason], monitor.scrapes.dropped_samples.get(reason, 0))
        yield dropped
        series = CounterMetricFamily(
            "dflash_dropped_series",
            "Label sets not tracked: beyond max_page_series in a page, or new while all "
            "max_series slots held series seen within the longest window (per scrape).",
        )
        series.add_metric([], monitor.dropped_series)
        yield series
        evicted = CounterMetricFamily(
            "dflash_evicted_series",
            "Tracked series replaced by a new one after not being seen for the longest window.",
        )
        evicted.add_metric([], monitor.evicted_series)
        yield evicted
        listeners = CounterMetricFamily(
            "dflash_verdict_listener_failures",
            "Verdict listeners (Kubernetes Events) that failed or timed out.",
        )
        listeners.add_metric([], monitor.listener_failures + self._event_failures())
        yield listeners
        durations = monitor.scrapes.durations
        last = GaugeMetricFamily(
            "dflash_scrape_duration_seconds", "Duration of the last engine probe cycle."
        )
        last.add_metric([], durations[-1] if durations else 0.0)
        yield last

    def _event_failures(self) -> int:
        return sum(
            int(getattr(listener, "failures", 0)) for listener in self.monitor.verdict_listeners
        )

    def _acceptance(self) -> Iterator[Metric]:
        stats = self.monitor.stats()
        labels = ["window", "model_name", "engine"]
        mal = GaugeMetricFamily(
            "dflash_mean_acceptance_length",
            "Mean acceptance length 1 + accepted / drafts over the window.",
            labels=labels,
        )
        rate = GaugeMetricFamily(
            "dflash_draft_acceptance_rate",
            "Drafted-token acceptance rate accepted / draft_tokens over the window.",
            labels=labels,
        )
        position = GaugeMetricFamily(
            "dflash_position_acceptance_rate",
            "Acceptance at draft position i: accepted_per_pos[i] / drafts over the window.",
            labels=[*labels, "position"],
        )
        tokens = GaugeMetricFamily(
            "dflash_output_tokens_per_second",
            "Generated tokens per second over the window.",
            labels=labels,
        )
        drafts = GaugeMetricFamily(
            "dflash_drafts_per_second",
            "Speculative drafts per second over the window.",
            labels=labels,
        )
        k_in_effect = GaugeMetricFamily(
            "dflash_k_in_effect",
            "Drafted tokens per draft over the window: the k in effect (a k schedule lowers it "
            "with the running batch size).",
            labels=labels,
        )
        verdict = GaugeMetricFamily(
            "dflash_acceptance_verdict",
            "1 for the current verdict on the acceptance curve "
            "(healthy, degraded, collapsed, no-data).",
            labels=[*labels, "verdict"],
        )
        verdict_code = GaugeMetricFamily(
            "dflash_acceptance_verdict_code",
            "Verdict as a number: -1 no-data, 0 healthy, 1 degraded, 2 collapsed.",
            labels=labels,
        )

        def add(window: str, model: str, engine: str, ws: WindowStats) -> None:
            values = [window, model, engine]
            if ws.mean_acceptance_length is not None:
                mal.add_metric(values, ws.mean_acceptance_length)
            if ws.draft_acceptance_rate is not None:
                rate.add_metric(values, ws.draft_acceptance_rate)
            for i, value in enumerate(ws.per_position_acceptance):
                position.add_metric([*values, str(i)], value)
            if ws.output_tokens_per_s is not None:
                tokens.add_metric(values, ws.output_tokens_per_s)
            if ws.drafts_per_s is not None:
                drafts.add_metric(values, ws.drafts_per_s)
            if ws.k_in_effect is not None:
                k_in_effect.add_metric(values, ws.k_in_effect)
            for v in Verdict:
                verdict.add_metric([*values, v.value], 1.0 if v == ws.verdict else 0.0)
            verdict_code.add_metric(values, VERDICT_CODES[ws.verdict])

        resets = CounterMetricFamily(
            "dflash_counter_resets",
            "Engine counter resets seen (engine restarts); each restarts the windows.",
            labels=["model_name", "engine"],
        )
        for series in stats.series:
            model = series.labels.get("model_name", "")
            engine = series.labels.get("engine", "")
            for window, ws in series.windows.items():
                add(window, model, engine, ws)
            resets.add_metric([model, engine], series.counter_resets)
        yield from (mal, rate, position, tokens, drafts, k_in_effect, verdict, verdict_code, resets)


def build_registry(monitor: EngineMonitor) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SidecarCollector(monitor))
    return registry
