"""A bounded window of counter snapshots per engine series, and the rates over it.

Counters only go up while an engine lives; when any of them goes down (an engine restart) the
window starts over, so no rate is ever computed across a reset: no negative or NaN values.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from dflash_sidecar.exposition import SeriesSample


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


@dataclass(frozen=True)
class Snapshot:
    at: float  # monotonic seconds
    drafts: float
    draft_tokens: float
    accepted: float
    accepted_per_pos: tuple[float, ...]
    generation_tokens: float

    @classmethod
    def of(cls, at: float, sample: SeriesSample) -> Snapshot:
        positions = sample.accepted_per_pos
        per_pos = tuple(positions.get(i, 0.0) for i in range(max(positions, default=-1) + 1))
        return cls(
            at=at,
            drafts=sample.drafts,
            draft_tokens=sample.draft_tokens,
            accepted=sample.accepted,
            accepted_per_pos=per_pos,
            generation_tokens=sample.generation_tokens,
        )

    def went_back_from(self, previous: Snapshot) -> bool:
        return (
            self.drafts < previous.drafts
            or self.draft_tokens < previous.draft_tokens
            or self.accepted < previous.accepted
            or self.generation_tokens < previous.generation_tokens
            or (
                len(self.accepted_per_pos) != len(previous.accepted_per_pos)
                and bool(previous.accepted_per_pos)
            )
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
        return cls(
            seconds=new.at - old.at,
            drafts=new.drafts - old.drafts,
            draft_tokens=new.draft_tokens - old.draft_tokens,
            accepted=new.accepted - old.accepted,
            accepted_per_pos=tuple(
                a - b for a, b in zip(new.accepted_per_pos, old.accepted_per_pos, strict=True)
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


class AcceptanceWindow:
    """Snapshots of one series, oldest first, at most `capacity` of them."""

    def __init__(self, capacity: int) -> None:
        if capacity < 2:
            raise ValueError(f"window capacity {capacity} must be at least 2")
        self._snapshots: deque[Snapshot] = deque(maxlen=capacity)
        self.resets = 0

    def __len__(self) -> int:
        return len(self._snapshots)

    @property
    def latest(self) -> Snapshot | None:
        return self._snapshots[-1] if self._snapshots else None

    def add(self, snapshot: Snapshot) -> bool:
        """Append a snapshot; True when it revealed a counter reset (the window restarted)."""
        latest = self.latest
        reset = latest is not None and snapshot.went_back_from(latest)
        if reset:
            self._snapshots.clear()
            self.resets += 1
        self._snapshots.append(snapshot)
        return reset

    def delta(self, seconds: float) -> Delta | None:
        """Increase over the last `seconds` (from the oldest snapshot inside it), if any."""
        latest = self.latest
        if latest is None:
            return None
        start = latest.at - seconds
        oldest = next((s for s in self._snapshots if s.at >= start), latest)
        if oldest is latest:
            return None
        return Delta.between(oldest, latest)
