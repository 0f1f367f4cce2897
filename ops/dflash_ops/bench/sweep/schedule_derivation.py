"""A k schedule (k per running batch size, vLLM's num_speculative_tokens_per_batch_size) derived
from a sweep's own measurements.

Each level's recommended setting gives a k (0 for `off`); the level is placed at the running
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
from dflash_ops.bench.sweep.analysis import SweepAnalysis
from dflash_ops.bench.sweep.deployers import Setting
from dflash_ops.speculative_schedule import OPEN_END, Schedule, short_form
from dflash_ops.vocabulary import SpeculativeMethod


class LevelPick(BaseModel):
    level: str
    setting: str
    k: int
    running_batch: float = Field(description="p50 of the engine's running requests there")


class DerivedSchedule(BaseModel):
    picks: list[LevelPick]
    ranges: list[tuple[int, int, int]] = Field(
        description="vLLM's [first, last, k] running-batch ranges (last 65536: open)"
    )
    short_form: str
    largest_k: int
    method: SpeculativeMethod


class NoSchedule(BaseModel):
    reason: str


def derive_schedule(
    analysis: SweepAnalysis, results: dict[Setting, BenchResult]
) -> DerivedSchedule | NoSchedule:
    """The schedule the per-level recommendations make, or why there is none."""
    by_key = {s.key: s for s in results}
    picks: list[LevelPick] = []
    for recommendation in analysis.recommendations:
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
    methods = {by_key[p.setting].method for p in picks if p.k > 0}
    if not methods:
        return NoSchedule(reason="every level recommends off: no speculation to schedule")
    if len(methods) > 1:
        return NoSchedule(
            reason=f"the levels recommend different methods ({', '.join(sorted(methods))}): "
            "a schedule changes k, not the method"
        )
    if len({p.k for p in picks}) == 1:
        return NoSchedule(
            reason=f"every level recommends {picks[0].setting}: one static k, no schedule needed"
        )
    ranges = schedule_of([(p.running_batch, p.k) for p in picks])
    return DerivedSchedule(
        picks=picks,
        ranges=list(ranges),
        short_form=short_form(ranges),
        largest_k=max(k for _, _, k in ranges),
        method=methods.pop(),
    )


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
