"""vLLM's router in front of two real CPU engines (`bench router-policies`): prefix-aware routing
keeps the prefix-cache hits of one replica while round-robin spreads each prefix over both."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def test_cache_aware_routing_keeps_the_single_replica_hit_rate(tmp_path: Path) -> None:
    out = tmp_path / "router.json"
    done = subprocess.run(
        [sys.executable, "-m", "dflash_ops.cli", "bench", "router-policies", "--replicas", "2",
         "--policies", "cache_aware,kv_aware,round_robin", "--prefix-groups", "8",
         "--num-prompts", "48",
         "--concurrency", "4", "--max-tokens", "4", "--enforce-eager",
         "--state-dir", str(tmp_path / "stacks"), "--out", str(out)],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    runs = {run["policy"]: run for run in json.loads(out.read_text())["runs"]}
    single, aware, spread = runs["single replica"], runs["cache_aware"], runs["round_robin"]
    assert all(run["failed"] == 0 for run in runs.values())
    # Round-robin serves both replicas. Not necessarily alike: with both cores busy (a fresh
    # .ci/run, pass 2 beside) vllm-router's round_robin once split 48 requests 19/29.
    assert len(spread["share"]) == 2 and all(v > 0 for v in spread["share"].values()), spread
    assert single["hit_rate"] > 0.5
    # cache_aware keeps the hits one replica would have had.
    assert aware["hit_rate"] >= 0.9 * single["hit_rate"], runs
    # How cache_aware splits the groups over the replicas, and the hit rates of round_robin and
    # kv_aware against it, depend on when each engine's cache and the router's view of it are
    # updated relative to the next request (runs of one commit on this 2-core machine: once
    # cache_aware sent everything to one replica and round_robin matched its hit rate, once
    # kv_aware fell to 0.85x of round_robin): docs/replicas.md's measurement reports them; here,
    # what does not depend on timing. cache_aware routed on the prefixes it saw (through vLLM's
    # render endpoints, which the engines serve only with --enable-scale-out), not blindly.
    decisions = (tmp_path / "stacks" / "router-cache_aware.metrics").read_text()
    assert 'outcome="prefix_hit"' in decisions
    # kv_aware placed requests by the KV-cache events the engines published (ZMQ), not blind.
    kv = (tmp_path / "stacks" / "router-kv_aware.metrics").read_text()
    assert 'outcome="prefix_cost"' in kv, kv[-2000:]
    assert "| cache_aware |" in done.stdout and "vs single replica" in done.stdout
    # Nothing is left running.
    for replica in (tmp_path / "stacks").glob("replica-*"):
        assert not (replica / "state.json").exists()


def test_without_scale_out_cache_aware_routes_blind(tmp_path: Path) -> None:
    """The finding behind --enable-scale-out: without vLLM's render endpoints the router cannot
    tokenize a request, and cache_aware decides without prefix knowledge."""
    done = subprocess.run(
        [sys.executable, "-m", "dflash_ops.cli", "bench", "router-policies", "--replicas", "2",
         "--policies", "cache_aware", "--prefix-groups", "4", "--num-prompts", "12",
         "--concurrency", "2", "--max-tokens", "2", "--enforce-eager", "--no-scale-out",
         "--state-dir", str(tmp_path / "stacks")],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    decisions = (tmp_path / "stacks" / "router-cache_aware.metrics").read_text()
    assert 'outcome="missing_tokens"' in decisions and 'outcome="prefix_hit"' not in decisions
