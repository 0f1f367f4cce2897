"""The local stack end to end: real vLLM CPU engine, sidecar, bench, losslessness."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from dflash_ops.bench.client import Endpoint
from dflash_ops.local import stack
from dflash_sidecar.engine_monitor import EngineMonitor
from dflash_sidecar.settings import SidecarSettings

from tests.e2e.conftest import start_engine_only

pytestmark = pytest.mark.e2e


def url_of(state: stack.StackState, name: str) -> str:
    return next(p.url for p in state.processes if p.name == name)


def get_json(url: str) -> dict:  # type: ignore[type-arg]
    with urllib.request.urlopen(url, timeout=30) as reply:
        return json.load(reply)  # type: ignore[no-any-return]


def bench(base_url: str, out: Path, *extra: str) -> dict:  # type: ignore[type-arg]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "dflash_ops.cli",
            "bench",
            "--base-url",
            base_url,
            "--concurrency",
            "1,4",
            "--max-tokens",
            "32",
            "--out",
            str(out),
            *extra,
        ],
        check=True,
        timeout=900,
    )
    return json.loads((out / "results.json").read_text())  # type: ignore[no-any-return]


def test_stack_is_up_and_a_second_up_starts_nothing(local_stack: stack.StackState) -> None:
    rows = stack.status(local_stack.config.state_dir)
    assert {r["name"] for r in rows} >= {"engine", "sidecar"}
    assert all(r["healthy"] for r in rows), rows
    again = stack.up(local_stack.config)
    assert [p.pid for p in again.processes] == [p.pid for p in local_stack.processes]


def test_bench_reports_acceptance_consistent_with_the_raw_counters(
    local_stack: stack.StackState, tmp_path: Path
) -> None:
    engine = url_of(local_stack, "engine")
    result = bench(engine, tmp_path)
    assert [r["concurrency"] for r in result["runs"]] == [1, 4]
    assert (tmp_path / "results.md").read_text().count("|") > 10
    assert (tmp_path / "acceptance.png").read_bytes()[:4] == b"\x89PNG"
    for run in result["runs"]:
        spec = run["spec_decode"]
        assert spec["drafts"] > 0
        assert spec["mean_acceptance_length"] == pytest.approx(
            1 + spec["accepted"] / spec["drafts"]
        )
        per_pos = spec["per_position_acceptance"]
        assert len(per_pos) == 4
        assert sum(p * spec["drafts"] for p in per_pos) == pytest.approx(spec["accepted"])
        assert 0 < per_pos[-1] < per_pos[0] < 1  # partial acceptance that decays by position
        assert run["output_tokens"] == 10 * 32
    assert result["kv_cache_tokens"] > 0


def test_sidecar_acceptance_equals_the_raw_counters(local_stack: stack.StackState) -> None:
    engine_url = url_of(local_stack, "engine")

    async def scenario() -> tuple[dict[str, float], dict[str, float], object]:
        monitor = EngineMonitor(
            SidecarSettings(engine_url=engine_url, scrape_timeout_s=3.0), started_at=0.0
        )
        endpoint = Endpoint(engine_url)
        try:
            raw0 = await endpoint.counters()
            await monitor.run_once(0.0)
            await asyncio.gather(
                *(endpoint.chat("tiny", f"Tell me about {w}.", 24) for w in ("TCP", "UDP", "DNS"))
            )
            raw1 = await endpoint.counters()
            await monitor.run_once(30.0)
            assert raw0 is not None and raw1 is not None
            return (
                {"drafts": raw0.drafts, "accepted": raw0.accepted, "gen": raw0.generation_tokens},
                {"drafts": raw1.drafts, "accepted": raw1.accepted, "gen": raw1.generation_tokens},
                monitor.stats(30.0).windows["1m"],
            )
        finally:
            await monitor.aclose()
            await endpoint.aclose()

    raw0, raw1, window = asyncio.run(scenario())
    drafts = raw1["drafts"] - raw0["drafts"]
    accepted = raw1["accepted"] - raw0["accepted"]
    assert drafts > 0
    assert window.drafts == drafts  # type: ignore[attr-defined]
    assert window.mean_acceptance_length == pytest.approx(1 + accepted / drafts)  # type: ignore[attr-defined]


def test_sidecar_process_serves_stats_and_metrics(local_stack: stack.StackState) -> None:
    sidecar = url_of(local_stack, "sidecar")
    stats = get_json(f"{sidecar}/stats")
    assert stats["ready"] is True
    assert set(stats["windows"]) == {"1m", "5m", "15m"}
    assert stats["windows"]["15m"]["drafts"] > 0
    with urllib.request.urlopen(f"{sidecar}/metrics", timeout=10) as reply:
        body = reply.read().decode()
    assert "dflash_mean_acceptance_length{" in body and "dflash_engine_ready 1.0" in body


def test_sidecar_endpoints_under_bounded_loopback_load(local_stack: stack.StackState) -> None:
    sidecar = url_of(local_stack, "sidecar")

    async def load() -> list[float]:
        import httpx

        latencies: list[float] = []
        async with httpx.AsyncClient(base_url=sidecar, timeout=10) as client:

            async def worker() -> None:
                for path in ("/readyz", "/metrics", "/stats", "/livez") * 25:
                    started = time.perf_counter()
                    reply = await client.get(path)
                    latencies.append(time.perf_counter() - started)
                    assert reply.status_code == 200, (path, reply.status_code)

            await asyncio.gather(*(worker() for _ in range(8)))
        return latencies

    latencies = asyncio.run(load())
    assert len(latencies) == 800
    assert sorted(latencies)[len(latencies) // 2] < 1.0  # median well under the probe timeout


def test_readiness_drops_when_the_engine_dies_and_returns_after_restart(
    local_stack: stack.StackState,
) -> None:
    sidecar = url_of(local_stack, "sidecar")
    engine = next(p for p in local_stack.processes if p.name == "engine")
    interval = 2.0  # the sidecar's default scrape interval
    stack.stop_process(engine)
    started = time.monotonic()
    while True:
        try:
            urllib.request.urlopen(f"{sidecar}/readyz", timeout=5)
        except urllib.error.HTTPError as err:
            assert err.code == 503
            reason = json.loads(err.read())["reason"]
            break
        assert time.monotonic() - started < 2 * interval + 2, "readiness still true"
        time.sleep(0.2)
    assert reason.startswith("engine down for") and "/health" in reason
    stack.restart_process(local_stack, "engine")
    deadline = time.monotonic() + 900
    while True:
        try:
            if urllib.request.urlopen(f"{sidecar}/readyz", timeout=5).status == 200:
                break
        except urllib.error.URLError:
            pass
        assert time.monotonic() < deadline, "readiness did not return after the restart"
        time.sleep(1)


def test_draft_quality_moves_acceptance(
    models_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    results = {}
    for noise in (0.0, 0.5):
        state_dir = tmp_path_factory.mktemp(f"noise{noise}")
        state = start_engine_only(state_dir, models_dir, draft_noise=noise)
        try:
            results[noise] = bench(url_of(state, "engine"), state_dir / "bench")
        finally:
            stack.down(state_dir, quiet=True)
    identical = results[0.0]["runs"][0]["spec_decode"]
    noisy = results[0.5]["runs"][0]["spec_decode"]
    assert identical["mean_acceptance_length"] > 4.5  # k=4: the maximum is 5
    assert noisy["mean_acceptance_length"] < 1.5
    assert identical["per_position_acceptance"][0] > 0.95


def test_greedy_speculation_is_lossless(
    local_stack: stack.StackState, models_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    state_dir = tmp_path_factory.mktemp("reference")
    reference = start_engine_only(state_dir, models_dir, method="off")
    try:
        out = state_dir / "bench"
        result = bench(
            url_of(local_stack, "engine"), out, "--check-lossless", url_of(reference, "engine")
        )
    finally:
        stack.down(state_dir, quiet=True)
    assert result["lossless"]["prompts"] == 10
    assert result["lossless"]["identical"] == 10, result["lossless"]["mismatches"]
