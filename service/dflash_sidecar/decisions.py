"""The sidecar's decisions, as functions of what it has seen: readiness, liveness, whether the
engine is generating, and each window's figures and verdict. The monitor (engine_monitor) does
the probing and keeps the state; everything it answers is decided here, from that state, the
settings and the time, so each rule is tested without a probe loop."""

from __future__ import annotations

from dataclasses import dataclass

from dflash_sidecar.acceptance_window import (
    AcceptanceFigures,
    Delta,
    acceptance_figures,
    smaller_k_acceptance_lengths,
)
from dflash_sidecar.engine_state import EngineState, EngineStateTracker
from dflash_sidecar.models import EngineLiveness, Readiness, WindowStats
from dflash_sidecar.settings import SidecarSettings
from dflash_sidecar.verdict import Verdict, judge, k_lowered


@dataclass
class ProbeState:
    """What the probes of the engine found, and when."""

    health_ok: bool = False
    health_detail: str = "no probe yet"
    metrics_ok: bool = False
    metrics_detail: str = "no /metrics read yet"  # why the last read failed
    metrics_failing_since: float | None = None
    last_probe_at: float | None = None
    last_progress_at: float | None = None  # generation counter moved or canary succeeded
    last_generation_tokens: float | None = None
    requests_running: float | None = None  # None: unknown (the last /metrics read failed)
    canary_due_at: float = 0.0
    canary_failure: str | None = None
    served_model: str | None = None


def stale_after(settings: SidecarSettings) -> float:
    """Age beyond which a snapshot (or the last probe) no longer describes the engine."""
    return 2 * settings.scrape_interval + settings.scrape_timeout


def fresh(probe: ProbeState, settings: SidecarSettings, now: float) -> bool:
    return probe.last_probe_at is not None and now - probe.last_probe_at <= stale_after(settings)


def stalled(probe: ProbeState, settings: SidecarSettings, now: float) -> bool:
    """Requests are running and no token came for longer than stall_timeout."""
    return (
        probe.requests_running is not None
        and probe.requests_running > 0
        and probe.last_progress_at is not None
        and now - probe.last_progress_at > settings.stall_timeout
    )


def unproven_for(probe: ProbeState, settings: SidecarSettings, now: float) -> float | None:
    """Seconds without proof of generation beyond stall_timeout (metrics unreadable and no
    canary succeeding), else None."""
    if probe.metrics_ok or probe.last_progress_at is None:
        return None
    idle = now - probe.last_progress_at
    return idle if idle > settings.stall_timeout else None


def generating(probe: ProbeState, settings: SidecarSettings, now: float) -> bool:
    return (
        probe.last_progress_at is not None
        and probe.canary_failure is None
        and not stalled(probe, settings, now)
        and unproven_for(probe, settings, now) is None
    )


def readiness(
    probe: ProbeState, engine: EngineStateTracker, settings: SidecarSettings, now: float
) -> Readiness:
    """Ready while the engine answers /health and is proven to generate; else why not."""
    p, s = probe, settings
    is_fresh = fresh(p, s, now)
    state = engine.state
    checks = {
        "probe_fresh": is_fresh,
        "health": p.health_ok,
        "metrics": p.metrics_ok,
        "generating": generating(p, s, now),
    }
    waited = engine.seconds_in_state(now)
    unproven = unproven_for(p, s, now)
    if p.last_probe_at is None:
        reason = "no probe of the engine yet"
    elif not is_fresh:
        reason = f"last engine probe is {now - p.last_probe_at:.0f}s old (monitor stuck)"
    elif state is EngineState.STARTING:
        reason = (
            f"engine loading: no answer from /health yet ({p.health_detail}); "
            f"{now - engine.started_at:.0f}s of the {s.startup_budget:.0f}s "
            "startup budget"
        )
    elif state is EngineState.START_TIMEOUT:
        reason = (
            f"engine did not come up within the {s.startup_budget:.0f}s startup budget: "
            f"{p.health_detail}"
        )
    elif not p.health_ok:
        reason = f"engine down for {waited:.0f}s: {p.health_detail}"
    elif p.canary_failure is not None:
        reason = f"engine answers /health but cannot generate: {p.canary_failure}"
    elif stalled(p, s, now):
        idle = now - (p.last_progress_at or now)
        reason = f"{p.requests_running:.0f} requests running, no tokens for {idle:.0f}s"
    elif unproven is not None:
        reason = (
            f"no proof of generation for {unproven:.0f}s: the engine's metrics are "
            f"unreadable ({p.metrics_detail}) and no canary succeeded"
        )
    elif p.last_progress_at is None:
        reason = "engine healthy, waiting for the first generated token"
    else:
        return Readiness(
            ready=True, reason="engine healthy and generating", state=state, checks=checks
        )
    return Readiness(ready=False, reason=reason, state=state, checks=checks)


def liveness(
    probe: ProbeState, engine: EngineStateTracker, settings: SidecarSettings, now: float
) -> EngineLiveness:
    """Whether the kubelet should restart the engine: only on a long, proven failure."""
    state, s = engine.state, settings
    seconds = engine.seconds_in_state(now)
    is_fresh = fresh(probe, s, now)
    if is_fresh and state is EngineState.DOWN and seconds >= s.engine_down_grace:
        return EngineLiveness(
            alive=False,
            state=state,
            reason=f"/health has failed for {seconds:.0f}s: {probe.health_detail}",
        )
    if is_fresh and state is EngineState.NOT_GENERATING and seconds >= s.not_generating_grace:
        return EngineLiveness(
            alive=False,
            state=state,
            reason=f"engine answers /health but has not generated for {seconds:.0f}s",
        )
    return EngineLiveness(alive=True, state=state, reason=f"{state.value} for {seconds:.0f}s")


def window_stats(
    delta: Delta | None, seconds: float, why_none: str, settings: SidecarSettings
) -> WindowStats:
    """A window's figures and verdict from its counter increase (`why_none` when it has none)."""
    k = settings.speculative_tokens
    figures = acceptance_figures(delta, k) if delta is not None and delta.seconds > 0 else None
    if delta is None or not isinstance(figures, AcceptanceFigures):
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
            verdict_reason=figures if isinstance(figures, str) else why_none,
        )
    drafts, mal = figures.drafts, figures.mean_acceptance_length
    k_in_effect = figures.k_in_effect
    k_max = settings.speculative_tokens or delta.known_k
    per_pos = figures.per_position
    if k_lowered(k_in_effect, k_max):
        # Positions past the k in effect were drafted in some drafts only: not measured.
        per_pos = per_pos[:1]
    verdict, reason = judge(
        drafts, mal, per_pos, settings.thresholds, k_in_effect=k_in_effect, k_max=k_max
    )
    return WindowStats(
        window_seconds=seconds,
        span_seconds=delta.seconds,
        drafts=drafts,
        mean_acceptance_length=mal,
        draft_acceptance_rate=figures.draft_acceptance_rate,
        per_position_acceptance=per_pos,
        k_in_effect=k_in_effect,
        smaller_k_acceptance_length=smaller_k_acceptance_lengths(per_pos),
        output_tokens_per_s=delta.generation_tokens / delta.seconds,
        drafts_per_s=drafts / delta.seconds,
        verdict=verdict,
        verdict_reason=reason,
    )
