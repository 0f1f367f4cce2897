"""Patch 0004 with vLLM 0.33.0's own KV-cache code: KVCacheManager, BlockPool, the hybrid
coordinator and the scheduler's prefill split, over the KV-cache groups vLLM forms for
Qwen3.8-Flash-Next on A100 TP2 (k=7, block 1680, --prefix-match-unit 16; scenarios in
tests.patches.vllm_probe). A first request runs an N-token prefix; the second shares it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.patches.conftest import ProbeRunner

pytestmark = pytest.mark.vllm033

# Hash boundaries (16 tokens) below each prompt end: what the target alone hits.
FINE = {1000: 992, 2000: 1984, 4000: 3984}
BLOCK_ALIGNED = {1000: 0, 2000: 1680, 4000: 3360}
Scenarios = dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def unpatched(run_probe: ProbeRunner) -> Scenarios:
    return run_probe(None, "prefix-hit-scenarios", "target", "sliding", "full")


@pytest.fixture(scope="module")
def patched(run_probe: ProbeRunner, patched_vllm: Path) -> Scenarios:
    names = ["target", "target-eagle", "sliding", "sliding-eagle", "sliding-block-aligned",
             "sliding-evict-window", "sliding-evict-below-window", "full"]  # fmt: skip
    return run_probe(patched_vllm, "prefix-hit-scenarios", *names)


def hits(result: dict[str, Any]) -> dict[int, int]:
    return {row["prefix"]: row["hit"] for row in result["rows"]}


def test_unpatched_sliding_window_draft_falls_back_to_whole_blocks(unpatched: Scenarios) -> None:
    assert unpatched["target"]["partial_hits"] and hits(unpatched["target"]) == FINE
    assert unpatched["sliding"]["partial_hits"] is False
    assert hits(unpatched["sliding"]) == BLOCK_ALIGNED


def test_patched_sliding_window_draft_hits_within_one_match_unit(patched: Scenarios) -> None:
    result = patched["sliding"]
    assert result["partial_hits"] and result["hash_block_size"] == 16
    assert result["groups"].count("draft") == 1
    for row in result["rows"]:
        n = row["prefix"]
        assert n - 16 <= row["hit"] == FINE[n] == row["draft_group_hit"], row
        # The shared tail block is copied on write in every group that hit inside it,
        # the draft's included.
        assert row["cow_copies"]["draft"] == 1 and row["cow_copies"]["attention"] == 1, row
    assert hits(result)[1000] >= 976


def test_patched_window_semantics(patched: Scenarios) -> None:
    """A 3984-token hit needs the draft's tokens [1937, 3984): block 1 and the partial tail.
    Without block 1 the draft holds no window past block 0; without block 0 nothing is lost."""
    (in_window,) = patched["sliding-evict-window"]["rows"]
    assert in_window["draft_group_hit"] == 1680 and in_window["hit"] < 3984
    (below,) = patched["sliding-evict-below-window"]["rows"]
    assert below["draft_group_hit"] == below["hit"] == 3984


def test_patched_block_aligned_lookups_are_unchanged(patched: Scenarios) -> None:
    result = patched["sliding-block-aligned"]
    assert result["hash_block_size"] == 1680 and not result["partial_hits"]
    assert hits(result) == BLOCK_ALIGNED
    assert all(row["cow_copies"]["draft"] == 0 for row in result["rows"])


def test_full_attention_draft_and_target_alone_keep_fine_hits(
    unpatched: Scenarios, patched: Scenarios
) -> None:
    for results in (unpatched, patched):
        assert hits(results["full"]) == hits(results["target"]) == FINE


def test_patched_eagle_style_sliding_window_drops_one_unit(patched: Scenarios) -> None:
    """An EAGLE-style draft's KV at the last position reads the next token: one hash unit is
    recomputed, as the target-alone EAGLE lookup does."""
    expected = {1000: 976, 2000: 1984, 4000: 3984}
    assert hits(patched["sliding-eagle"]) == hits(patched["target-eagle"]) == expected
