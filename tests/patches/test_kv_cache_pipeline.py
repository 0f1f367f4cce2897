"""Patch 0004 under async scheduling: the pipeline harness (tests.patches.kv_cache_pipeline) runs
vLLM 0.33.0's real AsyncScheduler and KV-cache managers in the engine's order (schedule N+1 before
update N), with drafts rejected, aborts and prefix-cache resets while steps are in flight,
immediate retries, preemptions, and a worker that executes each step in order with the block
tables it was scheduled with. Seeds where the harness fails with the same-step guard off, or with
a defect planted in the worker, are kept as fixed cases that must fail there.

Longer runs: `PYTHONPATH=<patched tree>:. python -m tests.patches.kv_cache_pipeline --geometry
production --seeds 0-999`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.patches.conftest import ProbeRunner
from tests.patches.kv_cache_harness import GEOMETRIES

pytestmark = pytest.mark.vllm033

SEEDS_PER_LAYOUT = 4

# Seeds that fail with the same-step guard switched off, each with the read it gets wrong.
FAILING_WITHOUT_THE_GUARD: dict[tuple[str, int], str] = {
    ("draft-block-2x", 1): "reads position 32 of group 0 (FullAttentionManager)",
    ("draft-block-2x", 3): "reads position 64 of group 0 (FullAttentionManager)",
    ("draft-block-2x", 4): "reads position 64 of group 0 (FullAttentionManager)",
}
# Seeds where a worker that runs a step's copies before the previous step's forward pass (the
# "copies-first" defect) reads a slot not yet written.
FAILING_WITH_COPIES_FIRST: dict[tuple[str, int], str] = {
    ("small", 0): "reads position 64 of group 0 (FullAttentionManager)",
    ("small", 6): "reads position 32 of group 1 (SlidingWindowManager)",
    ("draft-block-2x", 2): "reads position 32 of group 1 (SlidingWindowManager)",
}


def sweep(
    run_probe: ProbeRunner, tree: Path | None, geometry: str, seeds: list[int], *flags: str
) -> list[dict[str, Any]]:
    reports: list[dict[str, Any]] = run_probe(
        tree, "kv-pipeline", geometry, "--seeds", *map(str, seeds), *flags
    )["reports"]
    return reports


@pytest.mark.parametrize("geometry", sorted(GEOMETRIES))
def test_the_pipeline_keeps_every_read_slot_and_the_books(
    run_probe: ProbeRunner, patched_vllm: Path, geometry: str
) -> None:
    seeds = list(range(200, 200 + SEEDS_PER_LAYOUT))
    reports = sweep(run_probe, patched_vllm, geometry, seeds)
    failures = {r["seed"]: r["failure"] for r in reports if r["failure"]}
    assert failures == {}

    def total(key: str) -> int:
        return sum(r[key] for r in reports)

    # What makes the pipeline dangerous happens: drafts rejected, work aborted or preempted
    # with a step in flight, outputs for requests no longer running, immediate retries, and
    # fine-grained hits whose copy source the step before is still writing.
    assert total("drafts") > total("rejected") > 0
    assert total("aborts_in_flight") + total("resets") > 0
    assert total("stale_outputs") > 0
    assert total("retries") > 0
    assert total("sub_block_hits") >= 5 * SEEDS_PER_LAYOUT
    assert total("copies") > 0


def test_kept_seeds_fail_without_the_guard_and_pass_with_it(
    run_probe: ProbeRunner, patched_vllm: Path
) -> None:
    assert FAILING_WITHOUT_THE_GUARD, "no kept seed"
    for geometry in sorted({g for g, _ in FAILING_WITHOUT_THE_GUARD}):
        seeds = sorted(s for g, s in FAILING_WITHOUT_THE_GUARD if g == geometry)
        guarded = sweep(run_probe, patched_vllm, geometry, seeds)
        assert [r["failure"] for r in guarded] == [None] * len(seeds)
        for report in sweep(run_probe, patched_vllm, geometry, seeds, "--no-guard"):
            expected = FAILING_WITHOUT_THE_GUARD[geometry, report["seed"]]
            assert report["failure"] and expected in report["failure"], report


def test_a_worker_that_copies_before_the_previous_step_writes_is_caught(
    run_probe: ProbeRunner, patched_vllm: Path
) -> None:
    assert FAILING_WITH_COPIES_FIRST, "no kept seed"
    for geometry in sorted({g for g, _ in FAILING_WITH_COPIES_FIRST}):
        seeds = sorted(s for g, s in FAILING_WITH_COPIES_FIRST if g == geometry)
        reports = sweep(run_probe, patched_vllm, geometry, seeds, "--planted", "copies-first")
        for report in reports:
            expected = FAILING_WITH_COPIES_FIRST[geometry, report["seed"]]
            assert report["failure"] and expected in report["failure"], report
        # The kept seeds include copies whose source the step before writes.
        assert sum(r["in_flight_copy_sources"] for r in reports) > 0


def test_unpatched_vllm_is_clean_on_its_own_fine_grained_path(run_probe: ProbeRunner) -> None:
    """0.33.0 with the target alone (no sliding-window group) passes the same pipeline: the
    harness checks vLLM's pipeline, not an artifact of its own model of it."""
    reports = sweep(run_probe, None, "target-only", [200, 201])
    assert [r["failure"] for r in reports] == [None, None]
    assert sum(r["stale_outputs"] for r in reports) > 0
