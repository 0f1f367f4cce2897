"""The highest load whose goodput still meets the SLO, found by a bounded search.

A load level passes when it was measured to the end and at least `attainment` of its requests met
every `--goodput` objective. Starting at `low`, the load doubles until a level fails or `high`
is reached, then the gap between the last passing and the first failing level is bisected until
it is one request apart (concurrency) or within `tolerance` of the passing value (request rate),
or `max_probes` levels were run. Goodput is assumed to fall as load rises (the usual shape; a
noisy run can break it, which is why each probe's figures are kept in the results).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, Field

from dflash_ops.bench.core.results import LevelResult
from dflash_ops.bench.core.runner import Level

Axis = Literal["concurrency", "request-rate"]


class Probe(BaseModel):
    load: float
    slo_attainment: float | None
    passed: bool


class SearchSummary(BaseModel):
    axis: Axis
    low: float
    high: float
    attainment: float = Field(description="share of requests that must meet every objective")
    best: float | None = Field(description="the highest load that passed; null if none did")
    bounded_by_high: bool = Field(description="the highest load searched still passed")
    probes: list[Probe]


def passed(level: LevelResult, attainment: float) -> bool:
    return (
        level.partial is None
        and level.slo_attainment is not None
        and level.slo_attainment >= attainment
    )


@dataclass
class SaturationSearch:
    axis: Axis
    low: float
    high: float
    attainment: float
    max_probes: int = 12
    tolerance: float = 0.1
    max_concurrency: int | None = None
    loads: list[float] = field(default_factory=list)

    def level(self, load: float) -> Level:
        if self.axis == "concurrency":
            return Level(concurrency=int(load))
        return Level(request_rate=load, max_concurrency=self.max_concurrency)

    def _results(self, done: list[LevelResult]) -> list[tuple[float, bool]]:
        pairs = zip(self.loads, done, strict=False)
        return [(load, passed(level, self.attainment)) for load, level in pairs]

    def next_level(self, done: list[LevelResult]) -> Level | None:
        """The next load to measure given the levels measured so far, or None when done."""
        load = self._next_load(self._results(done))
        if load is None:
            return None
        self.loads.append(load)
        return self.level(load)

    def _next_load(self, results: list[tuple[float, bool]]) -> float | None:
        if not results:
            return self.low
        if len(results) >= self.max_probes:
            return None
        good = [load for load, ok in results if ok]
        bad = [load for load, ok in results if not ok]
        if not good:
            return None  # even the lowest load misses the objectives
        best = max(good)
        above = [load for load in bad if load > best]
        if not above:
            if best >= self.high:
                return None
            return min(best * 2, self.high)
        worst = min(above)
        if self.axis == "concurrency":
            if worst - best <= 1:
                return None
            return float((int(best) + int(worst)) // 2)
        if (worst - best) <= self.tolerance * best:
            return None
        return (best + worst) / 2

    def summary(self, done: list[LevelResult]) -> SearchSummary:
        results = self._results(done)
        good = [load for load, ok in results if ok]
        best = max(good) if good else None
        return SearchSummary(
            axis=self.axis,
            low=self.low,
            high=self.high,
            attainment=self.attainment,
            best=best,
            bounded_by_high=best is not None and best >= self.high,
            probes=[
                Probe(load=load, slo_attainment=lv.slo_attainment, passed=ok)
                for (load, ok), lv in zip(results, done, strict=False)
            ],
        )
