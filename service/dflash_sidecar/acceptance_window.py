"""A bounded window of counter snapshots per engine series, and the rates over it.

Only samples that can be trusted enter a window: every counter present, finite, non-negative
and listed once, per-position counters for positions 0..n-1. An engine restart (vLLM's
generation counter goes back) restarts the window; any other counter going back without that is
an inconsistent sample and is dropped, unless it persists (then the engine did restart and the
window starts over). Windows end now, not at the last snapshot: a window whose newest snapshot is
stale reports no data. Figures that would be impossible (an acceptance rate above 1, a mean
acceptance length above k + 1) are never reported: the window says why instead.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from enum import StrEnum

from dflash_sidecar.metrics_parser import SPEC_COUNTERS, SeriesSample
from dflash_sidecar.vllm_metrics import ACCEPTED_PER_POS, GENERATION_TOKENS

# Consecutive inconsistent samples after which the counters are taken as really restarted.
RESTART_AFTER_INCONSISTENT = 3


def acceptance_ratios(
    drafts: float, draft_tokens: float, accepted: float, accepted_per_pos: list[float]
) -> tuple[float | None, float | None, list[float]]:
    """Mean acceptance length (1 + accepted / drafts), drafted-token acceptance rate
    (accepted / draft_tokens) and per-position acceptance (accepted_per_pos[i] / drafts);
    None (or empty) where the denominator is zero, so never NaN."""
    return (
        1 + accepted / drafts if drafts > 0 else None,
        accepted / draft_tokens if draft_tokens > 0 else None,
        [p / drafts for p in accepted_per_pos] if drafts > 0 else [],
    )


def impossible_figures(
    drafts: float,
    draft_tokens: float,
    accepted: float,
    accepted_per_pos: list[float],
) -> str | None:
    """Why these counter increases cannot come from a real engine, or None if they can."""
    values = [drafts, draft_tokens, accepted, *accepted_per_pos]
    if any(not math.isfinite(v) or v < 0 for v in values):
        return "a negative or non-finite counter increase"
    if accepted > draft_tokens:
        return f"{accepted:g} tokens accepted of {draft_tokens:g} drafted"
    if accepted_per_pos:
        if any(p > drafts for p in accepted_per_pos):
            return "a position accepted more often than there were drafts"
        if draft_tokens > drafts * len(accepted_per_pos):
            return f"more than {len(accepted_per_pos)} draft tokens per draft"
        total = sum(accepted_per_pos)
        # The engine updates the counters one after another, so a scrape can fall between two
        # updates of one step: allow that skew, not a different total.
        if abs(total - accepted) > max(8 * len(accepted_per_pos), 0.05 * accepted):
            return f"per-position acceptance sums to {total:g}, accepted is {accepted:g}"
    return None


class SampleProblem(StrEnum):
    UNTRUSTED = "untrusted"  # duplicate, NaN, infinite or negative counter in the page
    INCOMPLETE = "incomplete"  # a counter family or a per-position line missing
    INCONSISTENT = "inconsistent"  # a counter went back while the engine did not restart


@dataclass(frozen=True)
class Snapshot:
    at: float  # monotonic seconds
    drafts: float
    draft_tokens: float
    accepted: float
    accepted_per_pos: tuple[float, ...]
    generation_tokens: float

    @classmethod
    def of(cls, at: float, sample: SeriesSample) -> Snapshot | SampleProblem:
        """A snapshot of a sample, or why the sample cannot be one."""
        if sample.problems:
            return SampleProblem.UNTRUSTED
        if GENERATION_TOKENS not in sample.present:
            return SampleProblem.INCOMPLETE
        positions = sample.accepted_per_pos
        if sample.has_spec_decode:
            if any(family not in sample.present for family in SPEC_COUNTERS):
                return SampleProblem.INCOMPLETE
            if ACCEPTED_PER_POS in sample.present and sorted(positions) != list(
                range(len(positions))
            ):
                return SampleProblem.INCOMPLETE
        return cls(
            at=at,
            drafts=sample.drafts,
            draft_tokens=sample.draft_tokens,
            accepted=sample.accepted,
            accepted_per_pos=tuple(positions[i] for i in range(len(positions))),
            generation_tokens=sample.generation_tokens,
        )

    def restarted_from(self, previous: Snapshot) -> bool:
        """vLLM's generation counter only goes back when the engine restarted."""
        return self.generation_tokens < previous.generation_tokens

    def went_back_from(self, previous: Snapshot) -> bool:
        if len(self.accepted_per_pos) < len(previous.accepted_per_pos):
            return True
        return (
            self.drafts < previous.drafts
            or self.draft_tokens < previous.draft_tokens
            or self.accepted < previous.accepted
            or any(
                a < b
                for a, b in zip(self.accepted_per_pos, previous.accepted_per_pos, strict=False)
            )
        )


@dataclass(frozen=True)
class Delta:
    """Counter increase between two snapshots of one series (summable across series)."""

    seconds: float
    drafts: float
    draft_tokens: float
    accepted: float
    accepted_per_pos: tuple[float, ...]
    generation_tokens: float

    @classmethod
    def between(cls, old: Snapshot, new: Snapshot) -> Delta:
        width = len(new.accepted_per_pos)
        old_pos = old.accepted_per_pos + (0.0,) * (width - len(old.accepted_per_pos))
        return cls(
            seconds=new.at - old.at,
            drafts=new.drafts - old.drafts,
            draft_tokens=new.draft_tokens - old.draft_tokens,
            accepted=new.accepted - old.accepted,
            accepted_per_pos=tuple(
                a - b for a, b in zip(new.accepted_per_pos, old_pos, strict=True)
            ),
            generation_tokens=new.generation_tokens - old.generation_tokens,
        )

    def __add__(self, other: Delta) -> Delta:
        width = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        pos_a = self.accepted_per_pos + (0.0,) * (width - len(self.accepted_per_pos))
        pos_b = other.accepted_per_pos + (0.0,) * (width - len(other.accepted_per_pos))
        return Delta(
            seconds=max(self.seconds, other.seconds),
            drafts=self.drafts + other.drafts,
            draft_tokens=self.draft_tokens + other.draft_tokens,
            accepted=self.accepted + other.accepted,
            accepted_per_pos=tuple(a + b for a, b in zip(pos_a, pos_b, strict=True)),
            generation_tokens=self.generation_tokens + other.generation_tokens,
        )

    def impossible(self) -> str | None:
        return impossible_figures(
            self.drafts, self.draft_tokens, self.accepted, list(self.accepted_per_pos)
        )


class AcceptanceWindow:
    """Trusted snapshots of one series, oldest first, at most `capacity` of them."""

    def __init__(self, capacity: int) -> None:
        if capacity < 2:
            raise ValueError(f"window capacity {capacity} must be at least 2")
        self._snapshots: deque[Snapshot] = deque(maxlen=capacity)
        self.resets = 0
        self._inconsistent_in_a_row = 0

    def __len__(self) -> int:
        return len(self._snapshots)

    @property
    def latest(self) -> Snapshot | None:
        return self._snapshots[-1] if self._snapshots else None

    def add(self, snapshot: Snapshot) -> SampleProblem | bool:
        """Append a snapshot: True when it revealed an engine restart (the window restarted),
        False when it simply extended the window, a SampleProblem when it was dropped."""
        latest = self.latest
        if latest is not None and snapshot.at <= latest.at:
            return SampleProblem.INCONSISTENT
        restart = latest is not None and snapshot.restarted_from(latest)
        if latest is not None and not restart and snapshot.went_back_from(latest):
            self._inconsistent_in_a_row += 1
            if self._inconsistent_in_a_row < RESTART_AFTER_INCONSISTENT:
                return SampleProblem.INCONSISTENT
            restart = True
        self._inconsistent_in_a_row = 0
        if restart:
            self._snapshots.clear()
            self.resets += 1
        self._snapshots.append(snapshot)
        return restart

    def delta(self, seconds: float, now: float, stale_after: float) -> Delta | None:
        """Increase over the window [now - seconds, now], if the window holds two snapshots and
        the newest is not older than `stale_after` seconds."""
        latest = self.latest
        if latest is None or now - latest.at > stale_after:
            return None
        start = now - seconds
        oldest = next((s for s in self._snapshots if s.at >= start), latest)
        if oldest is latest:
            return None
        return Delta.between(oldest, latest)
