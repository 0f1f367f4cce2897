"""A level of a run: its load (`Level`), its label, and what it has measured so far
(`LevelProgress`, whose `result()` is a whole LevelResult at any moment, a partial level too)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dflash_sidecar.acceptance_window import Delta

from dflash_ops.bench.core import slo
from dflash_ops.bench.core.categories import by_category
from dflash_ops.bench.core.client import RequestRecord
from dflash_ops.bench.core.counters import Snapshot, spec_stats
from dflash_ops.bench.core.results import (
    LevelResult,
    Percentiles,
    PrefixCacheStats,
    RunningBatch,
    RunResult,
    SpecDecodeStats,
    Spread,
)


@dataclass(frozen=True)
class Level:
    concurrency: int | None = None
    request_rate: float | None = None
    max_concurrency: int | None = None


def pass_result(
    records: list[RequestRecord], started: float, objectives: dict[str, float] | None = None
) -> RunResult:
    ok = [r for r in records if r.ok]
    first = min((r.start for r in records), default=started)
    last = max((r.end for r in records), default=started)
    wall = max(last - first, 1e-9)
    output = sum(r.output_tokens for r in ok)
    good = None
    if objectives:
        good = sum(1 for r in ok if slo.is_good(r, objectives))
    return RunResult(
        requests=len(ok),
        failed=len(records) - len(ok),
        output_tokens=output,
        prompt_tokens=sum(r.prompt_tokens for r in ok),
        wall_s=wall,
        output_tokens_per_s=output / wall,
        requests_per_s=len(ok) / wall,
        good_requests=good,
        goodput_requests_per_s=None if good is None else good / wall,
    )


def level_label(level: Level) -> str:
    if level.concurrency is not None:
        return f"concurrency {level.concurrency}"
    cap = f", max {level.max_concurrency} in flight" if level.max_concurrency else ""
    return f"rate {level.request_rate:g}/s{cap}"


@dataclass
class LevelProgress:
    """What a level has measured so far; `result()` at any moment (a partial level too)."""

    level: Level
    objectives: dict[str, float]
    runs: list[RunResult] = field(default_factory=list)
    records: list[RequestRecord] = field(default_factory=list)
    first: Snapshot | None = None
    last: Snapshot | None = None
    engines_read: set[str] = field(default_factory=set)
    engines_unread: set[str] = field(default_factory=set)
    restarted_runs: list[int] = field(default_factory=list)
    # The counter increase of each run with acceptance figures, and why the others have none.
    deltas: list[Delta] = field(default_factory=list)
    withheld: dict[int, str] = field(default_factory=dict)
    partial: str | None = None
    pass_kept: int = 0  # records before the pass in progress
    pass_started: float = 0.0
    running_samples: list[float] = field(default_factory=list)

    def saw(self, taken: Snapshot) -> None:
        """Which engines' pages this snapshot read, and which it could not."""
        self.engines_read |= set(taken.read)
        self.engines_unread |= set(taken.unread)

    def result(self) -> LevelResult | None:
        """None while nothing was measured."""
        if not self.records:
            return None
        ok = [r for r in self.records if r.ok]
        runs = list(self.runs)
        if len(self.records) > self.pass_kept:  # interrupted inside a pass: what it finished
            runs.append(
                pass_result(self.records[self.pass_kept :], self.pass_started, self.objectives)
            )
        level_spec = spec_stats(sum(self.deltas[1:], self.deltas[0]) if self.deltas else None)
        prefix = None
        first = self.first.prefix if self.first else None
        last = self.last.prefix if self.last else None
        if not self.restarted_runs and first is not None and last is not None:
            hits, queries = last[0] - first[0], last[1] - first[1]
            prefix = PrefixCacheStats(
                queried_tokens=queries,
                hit_tokens=hits,
                hit_rate=hits / queries if queries else None,
            )
        share = None
        if not self.restarted_runs and self.first is not None and self.last is not None:
            first_done, last_done = self.first.finished, self.last.finished
            if len(last_done) > 1:
                done = {url: last_done[url] - first_done.get(url, 0.0) for url in last_done}
                total = sum(done.values())
                share = {url: n / total for url, n in done.items()} if total > 0 else None
        failures: dict[str, int] = {}
        for r in self.records:
            if not r.ok:
                kind = r.error_kind or "protocol"
                failures[kind] = failures.get(kind, 0) + 1
        notes = []
        if self.restarted_runs:
            which = ", ".join(str(i) for i in self.restarted_runs)
            notes.append(
                f"an engine restarted during run {which} (its generation counter went back): "
                "acceptance leaves out its counters there, prefix-cache hits are not reported"
            )
        notes += [f"run {run}: {why}" for run, why in self.withheld.items()]
        goodput = None
        attainment = None
        if self.objectives:
            goodput = Spread.of([r.goodput_requests_per_s or 0.0 for r in runs])
            # Every record belongs to one of `runs` (the pass in progress included).
            attainment = sum(r.good_requests or 0 for r in runs) / len(self.records)
        return LevelResult(
            concurrency=self.level.concurrency,
            request_rate=self.level.request_rate,
            max_concurrency=self.level.max_concurrency,
            runs=runs,
            output_tokens_per_s=Spread.of([r.output_tokens_per_s for r in runs]),
            requests_per_s=Spread.of([r.requests_per_s for r in runs]),
            ttft_ms=Percentiles.of_seconds([r.ttft_s for r in ok if r.ttft_s is not None]),
            tpot_ms=Percentiles.of_seconds([t for r in ok if (t := r.tpot_s) is not None]),
            itl_ms=Percentiles.of_seconds([gap for r in ok for gap in r.chunk_gaps_s]),
            e2e_ms=Percentiles.of_seconds([r.latency_s for r in ok]),
            spec_decode=level_spec if isinstance(level_spec, SpecDecodeStats) else None,
            prefix_cache=prefix,
            running_batch=RunningBatch.of(self.running_samples),
            replica_share=share,
            errors=[r.error for r in self.records if r.error][:5],
            failures=failures,
            goodput_requests_per_s=goodput,
            slo_attainment=attainment,
            token_count_source=(
                "tokenizer" if any(r.token_count_source == "tokenizer" for r in ok) else "usage"
            ),
            partial=self.partial,
            notes=notes,
            categories=by_category(ok),
            engines_counted=sorted(self.engines_read - self.engines_unread),
            engines_unread=sorted(self.engines_unread),
        )
