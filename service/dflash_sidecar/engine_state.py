"""What the engine is doing, as the sidecar sees it from loopback, and since when.

vLLM 0.33.0 only listens once its weights are loaded (up to an hour for a cold 360 GB load), so
connection errors before the first healthy `/health` mean "still loading", not "down". An engine
that answered and then stops answering is down; one that never answers within the startup budget
failed to start. `/health` answering 200 is not enough to serve either: the engine core can be
dead behind it, which the generation check (token progress or a one-token canary) catches.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class EngineState(StrEnum):
    STARTING = "starting"  # no healthy /health yet, within the startup budget
    START_TIMEOUT = "start_timeout"  # no healthy /health within the startup budget
    SERVING = "serving"  # /health 200 and generating
    NOT_GENERATING = "not_generating"  # /health 200 but no proof it can generate
    DOWN = "down"  # answered /health 200 before, does not now


@dataclass
class EngineStateTracker:
    started_at: float  # when the sidecar started watching (monotonic seconds)
    startup_budget: float
    state: EngineState = EngineState.STARTING
    since: float = 0.0
    has_served: bool = False  # /health answered 200 at least once since the sidecar started

    def __post_init__(self) -> None:
        self.since = self.started_at

    def update(self, now: float, health_ok: bool, generating: bool) -> EngineState:
        if health_ok:
            self.has_served = True
            state = EngineState.SERVING if generating else EngineState.NOT_GENERATING
        elif self.has_served:
            state = EngineState.DOWN
        elif now - self.started_at > self.startup_budget:
            state = EngineState.START_TIMEOUT
        else:
            state = EngineState.STARTING
        if state != self.state:
            self.state, self.since = state, now
        return state

    def seconds_in_state(self, now: float) -> float:
        return max(0.0, now - self.since)
