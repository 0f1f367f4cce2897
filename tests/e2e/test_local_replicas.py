"""`dflash-serve local up --replicas 2`: two real vLLM CPU engines, a sidecar each, the real
vllm-router in front on the main port and Prometheus scraping all of them; the benchmark through
the router; a replica SIGKILLed mid-run; `local down` leaving nothing behind.

Run through the CLI, as a user runs it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from dflash_ops.bench.client import Endpoint
from dflash_ops.bench.prompts import build
from dflash_ops.local import stack, supervisor
from dflash_ops.loopback import free_port, free_ports_in_a_row

pytestmark = pytest.mark.e2e
pytest.importorskip("vllm_router", reason="the router extra (vllm-router) is not installed")

CLI = [sys.executable, "-m", "dflash_ops.cli"]


@dataclass
class Replicas:
    state_dir: Path
    ports: dict[str, int]

    @property
    def router(self) -> str:
        return f"http://127.0.0.1:{self.ports['engine']}"

    @property
    def engines(self) -> list[str]:
        return [f"http://127.0.0.1:{self.ports['replica-base'] + i}" for i in range(2)]

    def up_argv(self) -> list[str]:
        return [
            *CLI, "local", "up", "--replicas", "2", "--method", "ngram", "--enforce-eager",
            "--state-dir", str(self.state_dir),
            "--engine-port", str(self.ports["engine"]),
            "--replica-base-port", str(self.ports["replica-base"]),
            "--sidecar-port", str(self.ports["sidecar"]),
            "--prometheus-port", str(self.ports["prometheus"]),
            "--router-metrics-port", str(self.ports["router-metrics"]),
        ]  # fmt: skip

    def router_metrics(self) -> str:
        url = f"http://127.0.0.1:{self.ports['router-metrics']}/metrics"
        with urllib.request.urlopen(url, timeout=5) as reply:
            return str(reply.read().decode())

    def gauge(self, name: str, worker: str) -> float | None:
        for line in self.router_metrics().splitlines():
            if line.startswith(f'{name}{{worker="{worker}"}}'):
                return float(line.rsplit(" ", 1)[1])
        return None


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory, models_dir: Path) -> Iterator[Replicas]:
    state_dir = tmp_path_factory.mktemp("replicas")
    (state_dir / "models").symlink_to(models_dir)
    ports = {
        "engine": free_port(),
        "replica-base": free_ports_in_a_row(2),
        "sidecar": free_ports_in_a_row(2),
        "prometheus": free_port(),
        "router-metrics": free_port(),
    }
    found = Replicas(state_dir, ports)
    done = subprocess.run(found.up_argv(), capture_output=True, text=True, timeout=1800)
    try:
        assert done.returncode == 0, done.stderr[-4000:]
        yield found
    finally:
        subprocess.run([*CLI, "local", "down", "--state-dir", str(state_dir)], timeout=300)


def test_status_shows_every_part_healthy(replicas: Replicas) -> None:
    listed = subprocess.run(
        [*CLI, "local", "status", "--format", "json", "--state-dir", str(replicas.state_dir)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    expected = {"engine-0", "engine-1", "sidecar-0", "sidecar-1", "router"}
    assert expected <= set(rows), rows
    assert all(rows[name]["healthy"] for name in expected), rows
    assert rows["router"]["url"] == replicas.router


def test_the_benchmark_through_the_router_sums_the_replicas(
    replicas: Replicas, tmp_path: Path
) -> None:
    out = tmp_path / "bench"
    done = subprocess.run(
        [*CLI, "bench", "--base-url", replicas.router,
         "--metrics-url", replicas.engines[0], "--metrics-url", replicas.engines[1],
         "--dataset-name", "shared-prefix", "--prefix-groups", "8", "--random-input-len", "120",
         "--num-prompts", "48", "--concurrency", "4", "--max-tokens", "8", "--repeats", "1",
         "--result-dir", str(out)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (level,) = json.loads((out / "results.json").read_text())["levels"]
    assert level["failures"] == {}
    share = level["replica_share"]
    assert set(share) == set(replicas.engines)
    # cache_aware spreads the 8 prefix groups over both replicas.
    assert min(share.values()) > 0.1, share
    # 8 groups of 6 requests: after each group's first request its prefix is cached on the
    # replica the router sends the group to.
    assert level["prefix_cache"]["hit_rate"] > 0.5, level["prefix_cache"]
    assert "requests finished per engine" in (out / "results.md").read_text()


def test_prometheus_scrapes_both_replicas_and_the_router(replicas: Replicas) -> None:
    query = urllib.parse.quote('up{job=~"vllm|dflash-sidecar|vllm-router"}')
    url = f"http://127.0.0.1:{replicas.ports['prometheus']}/api/v1/query?query={query}"
    deadline = time.monotonic() + 60
    while True:
        with urllib.request.urlopen(url, timeout=5) as reply:
            results = json.load(reply)["data"]["result"]
        up = {(r["metric"]["job"], r["metric"].get("pod")): r["value"][1] for r in results}
        wanted = {
            ("vllm", "local-0"), ("vllm", "local-1"), ("dflash-sidecar", "local-0"),
            ("dflash-sidecar", "local-1"), ("vllm-router", "router-0"),
        }  # fmt: skip
        if wanted <= set(up) and all(up[key] == "1" for key in wanted):
            break
        assert time.monotonic() < deadline, up
        time.sleep(2)


@dataclass
class Outcome:
    started: float
    ended: float
    ok: bool
    error: str | None


async def drive(router: str, seconds: float, on_start: float, kill: object) -> list[Outcome]:
    """Four clients streaming chats through the router for `seconds`; `kill()` runs at
    `on_start` seconds and returns when the replica is dead."""
    endpoint = Endpoint(router)
    prompts = build("shared-prefix", 400, 80, 11, 8)
    outcomes: list[Outcome] = []
    stop_at = time.monotonic() + seconds

    async def client(offset: int) -> None:
        i = offset
        while time.monotonic() < stop_at:
            started = time.monotonic()
            record = await endpoint.stream_chat("tiny", prompts[i % len(prompts)].messages, 24)
            outcomes.append(Outcome(started, time.monotonic(), record.ok, record.error))
            i += 4

    async def killer() -> None:
        await asyncio.sleep(on_start)
        await asyncio.to_thread(kill)  # type: ignore[arg-type]

    try:
        await asyncio.gather(*(client(i) for i in range(4)), killer())
    finally:
        await endpoint.aclose()
    return outcomes


def test_a_replica_killed_mid_run_fails_only_its_requests_in_flight(replicas: Replicas) -> None:
    state = stack.load_state(replicas.state_dir)
    assert state is not None
    victim = next(p for p in state.processes if p.name == "engine-1")
    dead_url = replicas.engines[1]
    killed_at: list[float] = []

    def kill() -> None:
        killed_at.append(time.monotonic())
        os.killpg(victim.pid, signal.SIGKILL)  # the API server, its engine core and workers

    outcomes = asyncio.run(drive(replicas.router, 25.0, 6.0, kill))
    (at,) = killed_at
    in_flight = [o for o in outcomes if o.started < at < o.ended]
    failed = [o for o in outcomes if not o.ok]
    assert len([o for o in outcomes if o.ended < at]) > 4, "no traffic before the kill"
    # Only requests in flight when the replica died may fail; every later one is served by
    # the other replica.
    late = [o for o in failed if o.started >= at]
    assert not late, [(round(o.started - at, 2), o.error) for o in late]
    assert len(failed) <= len(in_flight)
    assert len([o for o in outcomes if o.started > at + 1 and o.ok]) > 10
    # The router took it out of rotation (health checks every 2 s, ejected after 2 failures).
    assert replicas.gauge("vllm_router_worker_health", dead_url) == 0.0
    processed = replicas.gauge("vllm_router_processed_requests_total", dead_url)

    # `local up` restarts what died; the router sends to the replica again once it is back.
    done = subprocess.run(replicas.up_argv(), capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "restarting what is not running: engine-1" in done.stderr
    deadline = time.monotonic() + 60
    while replicas.gauge("vllm_router_worker_health", dead_url) != 1.0:
        assert time.monotonic() < deadline, replicas.router_metrics()[-2000:]
        time.sleep(1)
    time.sleep(11)  # its circuit, opened by the failed requests, closes after 10 s
    back = asyncio.run(drive(replicas.router, 12.0, 0.0, lambda: None))
    assert all(o.ok for o in back), [o.error for o in back if not o.ok][:3]
    again = replicas.gauge("vllm_router_processed_requests_total", dead_url)
    assert again is not None and processed is not None and again > processed


def test_down_stops_every_part(replicas: Replicas) -> None:
    state = stack.load_state(replicas.state_dir)
    assert state is not None
    done = subprocess.run(
        [*CLI, "local", "down", "--state-dir", str(replicas.state_dir)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for record in state.processes:
        assert supervisor.group_members(record) == [], record.name
        assert not supervisor.alive(record), record.name
    assert not (replicas.state_dir / "state.json").exists()
