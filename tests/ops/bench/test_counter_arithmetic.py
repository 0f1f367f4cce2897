"""The benchmark and the sidecar read the same counter pages the same way: one formula for
acceptance and one rule for an engine that restarted (dflash_sidecar.acceptance_window).

Each case is two /metrics pages of one engine (one or two series, as vLLM labels its engine
cores), taken 30 s apart: the sidecar scrapes them (its real probe cycle, over a fake engine
serving them), the benchmark takes them as the snapshots before and after a run. Their figures
must be identical, restarts, counters that step back, per-position lines that come and go, and
series that appear included; where the sidecar has no figures, neither has the benchmark."""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass

import pytest
from dflash_ops.bench.core.results import SpecDecodeStats
from dflash_ops.bench.core.runner import increase, snapshot_of, spec_stats
from dflash_sidecar.settings import SidecarSettings

from tests.service.fake_engine import Counters, FakeEngine, vllm_page
from tests.service.test_engine_monitor import cycle

URL = "http://engine:8000"


@dataclass
class Figures:
    drafts: float
    mean_acceptance_length: float | None
    draft_acceptance_rate: float | None
    per_position: list[float]


def page(engines: dict[str, Counters], drop_positions: set[str] = frozenset()) -> str:  # type: ignore[assignment]
    """One exposition holding every engine core's series (a core in drop_positions shows no
    per-position lines, as on a partial page)."""
    parts = []
    for engine, counters in engines.items():
        text = vllm_page(counters, engine=engine)
        if engine in drop_positions:
            text = "\n".join(
                line for line in text.splitlines() if "accepted_tokens_per_pos" not in line
            )
        parts.append(text)
    return "\n".join(parts) + "\n"


def sidecar_figures(before: str, after: str) -> Figures | None:
    from dflash_sidecar.engine_monitor import EngineMonitor

    engine = FakeEngine(before)
    settings = SidecarSettings.model_validate({"scrape_interval": 2.0, "canary_interval": 1000.0})
    monitor = EngineMonitor(settings, client=engine.client(), started_at=0.0)
    cycle(monitor, 100.0)
    engine.metrics = after
    cycle(monitor, 130.0)
    stats = monitor.stats(130.0).windows["1m"]
    if stats.mean_acceptance_length is None and not stats.drafts:
        return None
    return Figures(
        stats.drafts,
        stats.mean_acceptance_length,
        stats.draft_acceptance_rate,
        stats.per_position_acceptance,
    )


def bench_figures(before: str, after: str) -> Figures | None:
    counted = increase(snapshot_of({URL: before}, 100.0), snapshot_of({URL: after}, 130.0))
    stats = spec_stats(counted.delta)
    if not isinstance(stats, SpecDecodeStats) or (
        stats.mean_acceptance_length is None and not stats.drafts
    ):
        return None
    return Figures(
        stats.drafts,
        stats.mean_acceptance_length,
        stats.draft_acceptance_rate,
        stats.per_position_acceptance,
    )


def run_steps(counters: Counters, rng: random.Random, steps: int) -> None:
    k = len(counters.per_pos)
    for _ in range(steps):
        drafts = rng.randint(1, 40)
        accepted: list[int] = []
        for _ in range(k):
            accepted.append(rng.randint(0, accepted[-1] if accepted else drafts))
        counters.step(drafts, accepted, extra_tokens=rng.randint(0, 5))


def random_case(seed: int) -> tuple[str, str, str]:
    """Two pages and what happened between them."""
    rng = random.Random(seed)
    k = rng.randint(1, 6)
    cores = ["0"] if rng.random() < 0.6 else ["0", "1"]
    engines = {c: Counters(per_pos=[0.0] * k) for c in cores}
    for counters in engines.values():
        run_steps(counters, rng, rng.randint(0, 3))
    before = page(engines)
    happened = rng.choice(
        ["steady", "steady", "restart", "step-back", "partial-page", "new-core", "idle"]
    )
    later = copy.deepcopy(engines)
    target = rng.choice(cores)
    if happened == "restart":  # the core starts again from zero
        later[target] = Counters(per_pos=[0.0] * k)
        run_steps(later[target], rng, rng.randint(0, 2))
    elif happened == "step-back":  # one counter lower, the generation counter not
        later[target].accepted = max(0.0, later[target].accepted - rng.randint(1, 5))
        later[target].generation += 10
    elif happened == "new-core":
        later["7"] = Counters(per_pos=[0.0] * k)
        run_steps(later["7"], rng, 2)
    if happened != "idle":
        for counters in later.values():
            run_steps(counters, rng, rng.randint(1, 4))
    after = page(later, {target} if happened == "partial-page" else set())
    return before, after, happened


def assert_same(before: str, after: str, what: str) -> None:
    ours, sidecar = bench_figures(before, after), sidecar_figures(before, after)
    if sidecar is None or ours is None:
        assert ours is None and sidecar is None, (what, ours, sidecar)
        return
    assert ours.drafts == sidecar.drafts, what
    assert ours.mean_acceptance_length == pytest.approx(sidecar.mean_acceptance_length), what
    assert ours.draft_acceptance_rate == pytest.approx(sidecar.draft_acceptance_rate), what
    assert ours.per_position == pytest.approx(sidecar.per_position), what


def test_one_run_of_a_steady_engine_has_the_sidecars_figures() -> None:
    engines = {"0": Counters()}
    before = page(engines)
    run_steps(engines["0"], random.Random(1), 5)
    figures = bench_figures(before, page(engines))
    assert figures is not None and figures.drafts > 0
    assert_same(before, page(engines), "steady")


@pytest.mark.parametrize("seed", range(300))
def test_the_bench_and_the_sidecar_agree_on_every_page_pair(seed: int) -> None:
    before, after, happened = random_case(seed)
    assert_same(before, after, f"seed {seed}: {happened}")


def test_a_restart_gives_neither_figures_and_the_bench_names_it() -> None:
    running = Counters()
    run_steps(running, random.Random(2), 4)
    restarted = Counters()
    run_steps(restarted, random.Random(3), 1)
    before, after = page({"0": running}), page({"0": restarted})
    counted = increase(snapshot_of({URL: before}, 1.0), snapshot_of({URL: after}, 2.0))
    assert counted.restarted and counted.delta is None
    assert sidecar_figures(before, after) is None


def test_one_core_restarting_leaves_the_other_counted_on_both_sides() -> None:
    rng = random.Random(4)
    engines = {"0": Counters(), "1": Counters()}
    for counters in engines.values():
        run_steps(counters, rng, 3)
    before = page(engines)
    run_steps(engines["0"], rng, 3)
    engines["1"] = Counters()
    run_steps(engines["1"], rng, 1)
    after = page(engines)
    counted = increase(snapshot_of({URL: before}, 1.0), snapshot_of({URL: after}, 2.0))
    assert counted.restarted and counted.delta is not None and counted.delta.drafts > 0
    assert_same(before, after, "core 1 restarted")
