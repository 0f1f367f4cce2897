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
    # Both replicas serve under both policies.
    for run in (aware, spread):
        assert len(run["share"]) == 2 and min(run["share"].values()) > 0.1, run["share"]
    assert single["hit_rate"] > 0.5
    assert aware["hit_rate"] >= 0.9 * single["hit_rate"], runs
    # Round-robin sends each prefix to both replicas: each caches it once more.
    assert spread["hit_rate"] < aware["hit_rate"], runs
    # cache_aware routed on the prefixes it saw (through vLLM's render endpoints, which the
    # engines serve only with --enable-scale-out), not blindly.
    decisions = (tmp_path / "stacks" / "router-cache_aware.metrics").read_text()
    assert 'outcome="prefix_hit"' in decisions
    # kv_aware placed requests by the KV-cache events the engines published (ZMQ), not blind.
    kv = (tmp_path / "stacks" / "router-kv_aware.metrics").read_text()
    assert 'outcome="prefix_cost"' in kv, kv[-2000:]
    assert (
        runs["kv_aware"]["failed"] == 0 and runs["kv_aware"]["hit_rate"] > spread["hit_rate"] * 0.9
    )
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
