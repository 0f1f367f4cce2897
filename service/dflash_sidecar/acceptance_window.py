"""A bounded window of counter snapshots per engine series, and the rates over it.

Only samples that can be trusted enter a window: every counter present, finite, non-negative
and listed once, per-position counters for positions 0..n-1. An engine restart (vLLM's
generation counter goes back) restarts the window; any other counter going back without that is
an inconsistent sample and is dropped, unless it persists (then the engine did restart and the
window starts over). Windows end now, not at the last snapshot: a window whose newest snapshot is
stale reports no data. Per-position lines that vanish from some pages (or come back) do not
blank a window: the per-position figures then cover the span since the last page with as many
lines, the rest the whole window. Figures that would be impossible (an acceptance rate above 1,
more draft tokens per draft than k, a per-position curve that rises) are never reported: the
window says why instead.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import pairwise

from dflash_sidecar.metrics_parser import SPEC_COUNTERS, SeriesSample
from dflash_sidecar.vllm_metrics import GENERATION_TOKENS

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


def acceptance_length_at(per_position: Sequence[float], k: int) -> float:
    """The mean acceptance length a draft of length k would reach, predicted from per-position
    acceptance measured at a larger k: 1 + the first k position rates (a draft position's
    acceptance does not depend on how many positions follow it)."""
    return 1 + sum(per_position[:k])


def smaller_k_acceptance_lengths(per_position: list[float]) -> dict[int, float]:
    """acceptance_length_at for every k below the measured one."""
    return {k: acceptance_length_at(per_position, k) for k in range(1, len(per_position))}


def impossible_figures(
    drafts: float,
    draft_tokens: float,
    accepted: float,
    accepted_per_pos: list[float],
    k: int | None = None,
    pos_drafts: float | None = None,
) -> str | None:
    """Why these counter increases cannot come from a real engine, or None if they can.

    `accepted_per_pos` may cover a shorter span than the other counters (its lines were missing
    for a while): `pos_drafts` are the drafts over that span (default: the same span). `k`, when
    known, bounds the draft tokens per draft. The engine updates the counters one after another,
    so a scrape can fall between two updates of one step: the sums and the curve's shape allow
    that skew."""
    pos_drafts = drafts if pos_drafts is None else pos_drafts
    values = [drafts, draft_tokens, accepted, pos_drafts, *accepted_per_pos]
    if any(not math.isfinite(v) or v < 0 for v in values):
        return "a negative or non-finite counter increase"
    if accepted > draft_tokens:
        return f"{accepted:g} tokens accepted of {draft_tokens:g} drafted"
    if k is not None and draft_tokens > drafts * k:
        return f"{draft_tokens:g} draft tokens in {drafts:g} drafts: more than k={k} per draft"
    if not accepted_per_pos:
        return None
    width = len(accepted_per_pos)
    if k is not None and width > k:
        return f"per-position acceptance for {width} positions, more than k={k}"
    if any(p > pos_drafts for p in accepted_per_pos):
        return "a position accepted more often than there were drafts"
    for i, (here, there) in enumerate(pairwise(accepted_per_pos)):
        # Position i+1 is accepted only after position i was: the curve never rises (beyond
        # the skew of one step between two counter updates).
        if there > here + max(8.0, 0.05 * here):
            return f"per-position acceptance rises from position {i} to {i + 1}"
    if pos_drafts == drafts:
        if draft_tokens > drafts * width:
            return f"more than {width} draft tokens per draft"
        total = sum(accepted_per_pos)
        if abs(total - accepted) > max(8 * width, 0.05 * accepted):
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
        if sample.has_spec_decode and any(f not in sample.present for f in SPEC_COUNTERS):
            return SampleProblem.INCOMPLETE
        # Per-position lines are read as far as they run from position 0 without a gap: a page
        # missing some of them gives a shorter curve, never a wrong one.
        width = 0
        while width in positions:
            width += 1
        return cls(
            at=at,
            drafts=sample.drafts,
            draft_tokens=sample.draft_tokens,
            accepted=sample.accepted,
            accepted_per_pos=tuple(positions[i] for i in range(width)),
            generation_tokens=sample.generation_tokens,
        )

    def restarted_from(self, previous: Snapshot) -> bool:
        """vLLM's generation counter only goes back when the engine restarted."""
        return self.generation_tokens < previous.generation_tokens

    def went_back_from(self, previous: Snapshot) -> bool:
        """A counter is lower than before. Per-position lines that appear or vanish (a partial
        page) are not a step back: their width differs, and the window bridges over them."""
        if (
            self.drafts < previous.drafts
            or self.draft_tokens < previous.draft_tokens
            or self.accepted < previous.accepted
        ):
            return True
        if len(self.accepted_per_pos) != len(previous.accepted_per_pos):
            return False
        return any(
            a < b for a, b in zip(self.accepted_per_pos, previous.accepted_per_pos, strict=True)
        )


@dataclass(frozen=True)
class Delta:
    """Counter increase between two snapshots of one series (summable across series). The
    per-position increase may span less time than the rest (since the last snapshot with as many
    per-position lines as the newest): `pos_drafts` are the drafts over that span."""

    seconds: float
    drafts: float
    draft_tokens: float
    accepted: float
    accepted_per_pos: tuple[float, ...]
    generation_tokens: float
    pos_drafts: float = 0.0
    pos_seconds: float = 0.0
    known_k: int | None = None  # the most per-position lines the series has shown

    @classmethod
    def between(
        cls,
        old: Snapshot,
        new: Snapshot,
        pos_old: Snapshot | None = None,
        known_k: int | None = None,
    ) -> Delta:
        pos_old = old if pos_old is None else pos_old
        same_width = len(pos_old.accepted_per_pos) == len(new.accepted_per_pos)
        per_pos = (
            tuple(
                a - b for a, b in zip(new.accepted_per_pos, pos_old.accepted_per_pos, strict=True)
            )
            if same_width
            else ()
        )
        return cls(
            seconds=new.at - old.at,
            drafts=new.drafts - old.drafts,
            draft_tokens=new.draft_tokens - old.draft_tokens,
            accepted=new.accepted - old.accepted,
            accepted_per_pos=per_pos,
            generation_tokens=new.generation_tokens - old.generation_tokens,
            pos_drafts=new.drafts - pos_old.drafts if per_pos else 0.0,
            pos_seconds=new.at - pos_old.at if per_pos else 0.0,
            known_k=known_k,
        )

    def __add__(self, other: Delta) -> Delta:
        if not other.accepted_per_pos or not self.accepted_per_pos:
            source = self if self.accepted_per_pos else other
            per_pos, pos_drafts = source.accepted_per_pos, source.pos_drafts
            pos_seconds = source.pos_seconds
        else:
            width = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
            pos_a = self.accepted_per_pos + (0.0,) * (width - len(self.accepted_per_pos))
            pos_b = other.accepted_per_pos + (0.0,) * (width - len(other.accepted_per_pos))
            per_pos = tuple(a + b for a, b in zip(pos_a, pos_b, strict=True))
            pos_drafts = self.pos_drafts + other.pos_drafts
            pos_seconds = max(self.pos_seconds, other.pos_seconds)
        ks = [k for k in (self.known_k, other.known_k) if k is not None]
        return Delta(
            seconds=max(self.seconds, other.seconds),
            drafts=self.drafts + other.drafts,
            draft_tokens=self.draft_tokens + other.draft_tokens,
            accepted=self.accepted + other.accepted,
            accepted_per_pos=per_pos,
            generation_tokens=self.generation_tokens + other.generation_tokens,
            pos_drafts=pos_drafts,
            pos_seconds=pos_seconds,
            known_k=max(ks) if ks else None,
        )

    def per_position(self) -> list[float]:
        """Acceptance at each draft position over the per-position span (empty without it)."""
        if self.pos_drafts <= 0:
            return []
        return [p / self.pos_drafts for p in self.accepted_per_pos]

    def impossible(self, k: int | None = None) -> str | None:
        return impossible_figures(
            self.drafts,
            self.draft_tokens,
            self.accepted,
            list(self.accepted_per_pos),
            k=k if k is not None else self.known_k,
            pos_drafts=self.pos_drafts,
        )


@dataclass(frozen=True)
class AcceptanceFigures:
    """What a counter increase says about acceptance: the one formula for the sidecar's windows
    and the benchmark's runs."""

    drafts: float
    draft_tokens: float
    accepted: float
    mean_acceptance_length: float | None
    draft_acceptance_rate: float | None
    per_position: list[float]
    k_in_effect: float | None  # drafted tokens per draft (a k schedule lowers it)


def acceptance_figures(delta: Delta, k: int | None = None) -> AcceptanceFigures | str:
    """The figures of `delta`, or why they are withheld (they would be impossible)."""
    impossible = delta.impossible(k)
    if impossible is not None:
        return f"figures withheld: {impossible}"
    mal, rate, _ = acceptance_ratios(delta.drafts, delta.draft_tokens, delta.accepted, [])
    return AcceptanceFigures(
        drafts=delta.drafts,
        draft_tokens=delta.draft_tokens,
        accepted=delta.accepted,
        mean_acceptance_length=mal,
        draft_acceptance_rate=rate,
        per_position=delta.per_position(),
        k_in_effect=delta.draft_tokens / delta.drafts if delta.drafts > 0 else None,
    )


class AcceptanceWindow:
    """Trusted snapshots of one series, oldest first, at most `capacity` of them."""

    def __init__(self, capacity: int) -> None:
        if capacity < 2:
            raise ValueError(f"window capacity {capacity} must be at least 2")
        self._snapshots: deque[Snapshot] = deque(maxlen=capacity)
        self.resets = 0
        self.widest = 0  # most per-position lines since the last restart: the engine's k
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
            self.widest = 0
        self._snapshots.append(snapshot)
        self.widest = max(self.widest, len(snapshot.accepted_per_pos))
        return restart

    def _fresh(self, seconds: float, now: float, stale_after: float) -> list[Snapshot]:
        """The snapshots of [now - seconds, now], oldest first; none when the newest is older
        than `stale_after` seconds."""
        latest = self.latest
        if latest is None or now - latest.at > stale_after:
            return []
        return [s for s in self._snapshots if s.at >= now - seconds]

    def intervals(self, seconds: float, now: float, stale_after: float) -> list[Delta]:
        """The increase between each two consecutive snapshots in the window (a scrape interval
        each), where both have the same per-position lines; none when the window is stale."""
        in_window = self._fresh(seconds, now, stale_after)
        return [
            Delta.between(old, new)
            for old, new in pairwise(in_window)
            if len(old.accepted_per_pos) == len(new.accepted_per_pos)
        ]

    def delta(self, seconds: float, now: float, stale_after: float) -> Delta | None:
        """Increase over the window [now - seconds, now], if the window holds two snapshots and
        the newest is not older than `stale_after` seconds."""
        in_window = self._fresh(seconds, now, stale_after)
        if len(in_window) < 2:
            return None
        latest = in_window[-1]
        width = len(latest.accepted_per_pos)
        # Per-position figures from the oldest snapshot with as many lines as the newest: a
        # page that missed them for a while shortens their span instead of blanking them.
        pos_old = next(
            (s for s in in_window[:-1] if width and len(s.accepted_per_pos) == width), None
        )
        return Delta.between(
            in_window[0], latest, pos_old or in_window[0], known_k=self.widest or None
        )
