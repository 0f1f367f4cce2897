"""Patch 0004 case by case with vLLM 0.33.0's own KV-cache classes (cases in
tests.patches.kv_cache_cases): the sliding-window finder, the same-step copy guard, prompt-tail
registration, vLLM's own hybrid test as it reads after the patch, and Mooncake's store lookup."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.patches.conftest import ProbeRunner
from tests.patches.kv_cache_cases import CASES

pytestmark = pytest.mark.vllm033

UPSTREAM = "upstream_sliding_window_group_disables_partial_hash_hits"
# Cases that only hold with the patch: each must fail on 0.33.0, or it tests nothing.
NEW_BEHAVIOUR = [
    "fine_hit_on_a_partial_prompt_tail",
    "blocks_below_the_window_may_be_absent",
    "an_entry_past_max_length_serves_max_length",
    "eagle_drops_one_hash_unit",
    "lookups_need_alignment_equal_to_the_hash_unit",
    "a_copy_source_cached_this_step_defers_the_request",
    "prompt_tails_are_registered_only_for_fine_grained_hits",
    "hybrid_sliding_window_group_keeps_partial_hash_hits",
    "mooncake_store_lookup_takes_fine_grained_sliding_window_hits",
]


@pytest.fixture(scope="module")
def patched(run_probe: ProbeRunner, patched_vllm: Path) -> dict[str, dict[str, Any]]:
    return run_probe(patched_vllm, "kv-cases", *CASES)


@pytest.fixture(scope="module")
def unpatched(run_probe: ProbeRunner) -> dict[str, dict[str, Any]]:
    return run_probe(None, "kv-cases", *CASES)


@pytest.mark.parametrize("name", sorted(set(CASES) - {UPSTREAM}))
def test_patched_tree(patched: dict[str, dict[str, Any]], name: str) -> None:
    outcome = patched[name]
    assert outcome["ok"], outcome.get("traceback")


def test_upstream_test_of_the_old_behaviour_changes_with_the_patch(
    patched: dict[str, dict[str, Any]], unpatched: dict[str, dict[str, Any]]
) -> None:
    """vLLM's own test asserts that a sliding-window group turns fine-grained hits off; it holds
    on 0.33.0 and must be changed by the upstream PR (our version: hybrid_sliding_window_group_
    keeps_partial_hash_hits)."""
    assert unpatched[UPSTREAM] == {"ok": True, "result": {"hit": 8}}
    assert not patched[UPSTREAM]["ok"]


def test_the_cases_test_the_patch(unpatched: dict[str, dict[str, Any]]) -> None:
    assert set(NEW_BEHAVIOUR) <= set(CASES)
    passing = [name for name in NEW_BEHAVIOUR if unpatched[name]["ok"]]
    assert passing == [], f"these cases pass without the patch: {passing}"
    # The block-aligned path is unchanged, so its case holds on 0.33.0 too.
    assert unpatched["block_aligned_lookups_ignore_partial_entries"]["ok"]
