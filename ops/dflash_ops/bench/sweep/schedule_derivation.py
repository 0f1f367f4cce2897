"""A k schedule (k per running batch size, vLLM's num_speculative_tokens_per_batch_size) derived
from a sweep's own measurements.

Each level gives the k the sweep's rule picks among the speculative settings alone (the smallest
k within the spread of the fastest speculative one): a schedule changes k, it cannot turn the
draft model off, and k 0 in a schedule still pays for it (a draft_model drafter processes every
token; measured on the CPU paying pair: 0.81x of `off` at 64 running). Where `off` is the
sweep's recommendation the derivation says so, with the ratio, and the verification then
measures what the schedule gives up there. The level is placed at the running
batch the engine had while that setting ran it (the p50 of vllm:num_requests_running, not the
client's nominal concurrency: a closed loop of 16 clients keeps fewer than 16 requests running
when some wait on the network, and a request-rate level has no nominal batch at all). Between two
measured batches the boundary is their geometric mean (throughput follows the batch on a log
scale), so each range is served by the k of the nearest level measured; below the first level
the first k holds, above the last level the last k.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from dflash_ops.bench.core.results import BenchResult
from dflash_ops.bench.sweep.analysis import PointFigures, SweepAnalysis, recommend
from dflash_ops.bench.sweep.deployers import Setting
from dflash_ops.speculative_schedule import OPEN_END, Schedule, short_form
from dflash_ops.vocabulary import SpeculativeMethod


class LevelPick(BaseModel):
    level: str
    setting: str
    k: int
    running_batch: float = Field(description="p50 of the engine's running requests there")


class OffAhead(BaseModel):
    """A level where `off` is the sweep's recommendation: what the schedule's k costs there."""

    level: str
    best_speculative: str
    ratio: float = Field(description="the best speculative setting's mean tok/s over off's")

    def describe(self) -> str:
        return f"{self.level}: off recommended ({self.best_speculative} {self.ratio:.2f}x of it)"


class DerivedSchedule(BaseModel):
    picks: list[LevelPick]
    off_ahead: list[OffAhead] = Field(
        default_factory=list, description="levels where off beats the k the schedule gives"
    )
    ranges: list[tuple[int, int, int]] = Field(
        description="vLLM's [first, last, k] running-batch ranges (last 65536: open)"
    )
    short_form: str
    largest_k: int
    method: SpeculativeMethod

    def describe(self) -> str:
        picks = ", ".join(
            f"{p.level} -> k {p.k} at {p.running_batch:g} running" for p in self.picks
        )
        return f"derived from {picks}" + off_note(self.off_ahead)


class NoSchedule(BaseModel):
    reason: str
    off_ahead: list[OffAhead] = []

    def describe(self) -> str:
        return self.reason + off_note(self.off_ahead)


def off_note(off_ahead: list[OffAhead]) -> str:
    if not off_ahead:
        return ""
    return (
        "; " + "; ".join(o.describe() for o in off_ahead) + " - a schedule cannot turn the draft "
        "model off, so its k there is the best speculative one"
    )


def derive_schedule(
    analysis: SweepAnalysis, results: dict[Setting, BenchResult]
) -> DerivedSchedule | NoSchedule:
    """The schedule the per-level picks among the speculative settings make, or why there is
    none."""
    by_key = {s.key: s for s in results}
    speculative = {s.key for s in results if s.speculating and s.schedule is None}
    points = [p for p in analysis.points if p.key in speculative]
    if not points:
        return NoSchedule(reason="no speculative setting was measured: nothing to schedule")
    off_ahead = off_ahead_of(analysis, points)
    if len(off_ahead) == len(analysis.recommendations):
        return NoSchedule(
            reason="every level recommends off: no speculation to schedule", off_ahead=off_ahead
        )
    picks: list[LevelPick] = []
    for recommendation in recommend(points):
        setting = by_key[recommendation.recommended]
        level = next(lv for lv in results[setting].levels if lv.label == recommendation.level)
        if level.running_batch is None:
            return NoSchedule(
                reason=f"no running batch was measured at {recommendation.level} (the engine's "
                "/metrics has no vllm:num_requests_running, or the level was under a second)"
            )
        picks.append(
            LevelPick(
                level=recommendation.level,
                setting=setting.key,
                k=setting.k,
                running_batch=level.running_batch.p50,
            )
        )
    methods = {by_key[p.setting].method for p in picks}
    if len(methods) > 1:
        return NoSchedule(
            reason=f"the levels pick different methods ({', '.join(sorted(methods))}): "
            "a schedule changes k, not the method",
            off_ahead=off_ahead,
        )
    if len({p.k for p in picks}) == 1:
        return NoSchedule(
            reason=f"every level picks {picks[0].setting} among the speculative settings: one "
            "static k, no schedule needed",
            off_ahead=off_ahead,
        )
    ranges = schedule_of([(p.running_batch, p.k) for p in picks])
    return DerivedSchedule(
        picks=picks,
        off_ahead=off_ahead,
        ranges=list(ranges),
        short_form=short_form(ranges),
        largest_k=max(k for _, _, k in ranges),
        method=methods.pop(),
    )


def off_ahead_of(analysis: SweepAnalysis, speculative: list[PointFigures]) -> list[OffAhead]:
    out = []
    for recommendation in analysis.recommendations:
        here = [p for p in analysis.points if p.level == recommendation.level]
        off = next(p for p in here if p.key == recommendation.recommended)
        if off.k > 0:
            continue
        best = max(
            (p for p in speculative if p.level == recommendation.level),
            key=lambda p: p.output_tokens_per_s,
        )
        ratio = best.output_tokens_per_s / off.output_tokens_per_s if off.output_tokens_per_s else 0
        out.append(OffAhead(level=recommendation.level, best_speculative=best.key, ratio=ratio))
    return out


def schedule_of(points: list[tuple[float, int]]) -> Schedule:
    """Ranges of the running batch from (measured batch, k) points: each batch size gets the k
    of the nearest point on a log scale; neighbouring ranges with one k are merged. Points at
    the same whole batch keep the smaller k (fewer KV blocks per request at equal speed)."""
    at: dict[int, int] = {}
    for batch, k in points:
        whole = max(1, round(batch))
        at[whole] = min(k, at.get(whole, k))
    batches = sorted(at)
    ranges: list[tuple[int, int, int]] = []
    first = 1
    for index, batch in enumerate(batches):
        if index + 1 < len(batches):
            following = batches[index + 1]
            last = min(max(math.floor(math.sqrt(batch * following)), batch), following - 1)
        else:
            last = OPEN_END
        k = at[batch]
        if ranges and ranges[-1][2] == k:
            ranges[-1] = (ranges[-1][0], last, k)
        else:
            ranges.append((first, last, k))
        first = last + 1
    return tuple(ranges)
