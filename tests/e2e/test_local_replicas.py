"""`dflash-serve local up --replicas 2 --api-key KEY`: two real vLLM CPU engines, a sidecar
each, the real vllm-router in front on the main port, the chart's door (real nginx) in front of
the router and of each engine, and Prometheus scraping all of them; the benchmark through the
router; the door probed on every route vLLM and the router register, without a key, with a
wrong key and with the old key after a rotation made while benchmarks run; a replica SIGKILLed
mid-run; the router stopped mid-stream; `local down` leaving nothing behind.

Run through the CLI, as a user runs it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from dflash_ops.bench.core.client import Endpoint
from dflash_ops.bench.core.prompts import RandomShape, build
from dflash_ops.chart.helm import helm_template
from dflash_ops.local import door, stack, supervisor
from dflash_ops.loopback import free_port, free_ports_in_a_row

from tests.conftest import REPO_ROOT
from tests.e2e import route_tables

pytestmark = pytest.mark.e2e
pytest.importorskip("vllm_router", reason="the router extra (vllm-router) is not installed")

CLI = [sys.executable, "-m", "dflash_ops.cli"]


# The sidecars' canary (one token every 15 s on an idle engine) would move the engines' token
# counters the door probes hold still: one canary at start, then none for an hour.
QUIET_SIDECARS = {**os.environ, "DFLASH_SIDECAR_CANARY_INTERVAL": "3600"}


@dataclass
class Replicas:
    state_dir: Path
    ports: dict[str, int]
    key: str = "sk-replicas-first-3c9d"

    @property
    def bearer(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

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
            "--door-base-port", str(self.ports["door-base"]),
            "--api-key", self.key, "--max-model-len", "8192",
        ]  # fmt: skip

    def router_metrics(self) -> str:
        url = f"http://127.0.0.1:{self.ports['router-metrics']}/metrics"
        with urllib.request.urlopen(url, timeout=30) as reply:
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
        "door-base": free_ports_in_a_row(3),
    }
    found = Replicas(state_dir, ports)
    done = subprocess.run(
        found.up_argv(), capture_output=True, text=True, timeout=1800, env=QUIET_SIDECARS
    )
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
    expected |= {"door-engine-0", "door-engine-1", "door-router"}
    assert expected <= set(rows), rows
    assert all(rows[name]["healthy"] for name in expected), rows
    assert rows["door-router"]["url"] == replicas.router  # the router sits behind its door


def test_the_benchmark_through_the_router_sums_the_replicas(
    replicas: Replicas, tmp_path: Path
) -> None:
    out = tmp_path / "bench"
    done = subprocess.run(
        [*CLI, "bench", "--base-url", replicas.router,
         "--metrics-url", replicas.engines[0], "--metrics-url", replicas.engines[1],
         "--dataset-name", "shared-prefix", "--prefix-groups", "8", "--random-input-len", "120",
         "--num-prompts", "48", "--concurrency", "4", "--max-tokens", "8", "--repeats", "1",
         "--temperature", "0", "--ignore-eos",
         "--api-key", replicas.key, "--result-dir", str(out)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (level,) = json.loads((out / "results.json").read_text())["levels"]
    assert level["failures"] == {}
    share = level["replica_share"]
    # Each replica's share of the requests, from its own finished-requests counter: together
    # they are every request. How cache_aware places the 8 prefix groups depends on when each
    # engine's cache and the router's view of it are updated (two fresh .ci/runs of one commit:
    # once spread, once all 48 on one replica), so no split is asserted.
    assert set(share) == set(replicas.engines)
    assert sum(share.values()) == pytest.approx(1.0), share
    # 8 groups of 6 requests: after each group's first request its prefix is cached on the
    # replica the router sends the group to.
    assert level["prefix_cache"]["hit_rate"] > 0.5, level["prefix_cache"]
    assert "requests finished per engine" in (out / "results.md").read_text()


def test_prometheus_scrapes_both_replicas_and_the_router(replicas: Replicas) -> None:
    query = urllib.parse.quote('up{job=~"vllm|dflash-sidecar|vllm-router"}')
    url = f"http://127.0.0.1:{replicas.ports['prometheus']}/api/v1/query?query={query}"
    deadline = time.monotonic() + 60
    while True:
        with urllib.request.urlopen(url, timeout=30) as reply:
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


# -- the door: every route, every method, every entry -----------------------------------------

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
# A body each generation route would act on, had the door let it through.
GENERATE = {
    "model": "tiny", "prompt": "Count on:", "messages": [{"role": "user", "content": "hi"}],
    "input": "hi", "max_tokens": 4, "max_output_tokens": 4, "text": "hi", "url": "http://x",
}  # fmt: skip


@pytest.fixture(scope="module")
def routes() -> set[str]:
    """Request paths for every route of vLLM 0.33.0 (.venv-vllm033), of the CPU engine's vLLM
    that serves here (.venv) and of vllm-router 0.1.17, from their own route tables."""
    found: set[str] = set()
    for venv in (".venv-vllm033", ".venv"):
        python = REPO_ROOT / venv / "bin" / "python"
        if venv == ".venv" or python.exists():
            found |= set(route_tables.vllm_routes(python))
    import vllm_router

    extension = next(Path(vllm_router.__file__).parent.parent.glob("vllm_router_rs*.so"))
    router = route_tables.router_routes(extension)
    # What the review found open: the table must hold it, or the probe proves nothing.
    for admin in ("/add_worker", "/remove_worker", "/list_workers", "/flush_cache"):
        assert admin in router, admin
    assert {"/invocations", "/v1/responses", "/v1/messages", "/inference/v1/generate"} <= found
    return {route_tables.concrete(path) for path in found | router}


def engine_tokens(replicas: Replicas) -> float:
    """Prompt and generated tokens the engines have processed (their /metrics, via the door)."""
    total = 0.0
    for url in replicas.engines:
        with urllib.request.urlopen(url + "/metrics", timeout=30) as reply:
            for line in reply.read().decode().splitlines():
                if line.startswith(("vllm:generation_tokens_total", "vllm:prompt_tokens_total")):
                    total += float(line.rsplit(" ", 1)[1])
    return total


def probe(replicas: Replicas, paths: set[str], headers: dict[str, str]) -> list[str]:
    """Every method on every path through every entry (the router's door, each engine's door);
    returns what broke the door's contract: a 2xx outside the open paths of that entry, an admin
    or unauthenticated route that is not 404, a keyed path that is not 401."""
    from concurrent.futures import ThreadPoolExecutor

    open_paths = door.door_paths()["open"]
    never = {route_tables.concrete(p) for p in door.door_paths()["never"]}
    keyed = {
        "router": {route_tables.concrete(p) for p in door.default_keyed_paths()},
        "engine": {route_tables.concrete(p) for p in door.default_keyed_paths()}
        | {route_tables.concrete(p) for p in door.door_paths()["routerRender"]},  # cache_aware
    }
    entries = [(replicas.router, "router")] + [(url, "engine") for url in replicas.engines]
    jobs = [(e, role, m, p) for e, role in entries for m in METHODS for p in sorted(paths)]
    problems: list[str] = []
    # One connection per request: nginx closes a kept-alive connection after refusing a request
    # whose body it did not read, and a pooled client may race that close; the probe asks what
    # the door answers, not how it reuses connections.
    headers = {**headers, "Connection": "close"}
    with httpx.Client(timeout=10) as client:

        def one(job: tuple[str, str, str, str]) -> str | None:
            entry, role, method, path = job
            body = GENERATE if method in ("POST", "PUT", "PATCH") else None
            status = client.request(method, entry + path, json=body, headers=headers).status_code
            where = f"{method} {path} via {role} door {entry}: {status}"
            if 200 <= status < 300 and path not in open_paths[role]:
                return where
            if path in never and status != 404:
                return where
            if path in keyed[role] and status != 401:
                return where
            return None

        with ThreadPoolExecutor(8) as pool:
            problems = [p for p in pool.map(one, jobs) if p]
    return problems


@pytest.mark.parametrize("key", [None, "sk-wrong"], ids=["no-key", "wrong-key"])
def test_without_a_valid_key_no_route_answers_but_health_and_metrics(
    replicas: Replicas, routes: set[str], key: str | None
) -> None:
    before = engine_tokens(replicas)
    problems = probe(replicas, routes, {"Authorization": f"Bearer {key}"} if key else {})
    assert not problems, problems[:20]
    assert engine_tokens(replicas) == before  # nothing generated, nothing tokenized
    assert len(routes) > 100


def test_with_the_key_the_admin_routes_stay_unreachable(replicas: Replicas) -> None:
    with httpx.Client(timeout=10) as client:
        for path in ("/list_workers", "/add_worker?url=http://127.0.0.1:1", "/invocations"):
            for method in ("GET", "POST"):
                reply = client.request(method, replicas.router + path, headers=replicas.bearer)
                assert reply.status_code == 404, (method, path, reply.text)
        models = client.get(replicas.router + "/v1/models", headers=replicas.bearer)
        assert models.status_code == 200 and models.json()["data"][0]["id"] == "tiny"
    # The router still knows both engines (nobody removed them).
    assert replicas.gauge("vllm_router_worker_health", replicas.engines[1]) == 1.0


# What a client sends to each keyed generation route, and where the generated text is.
WITH_KEY = {
    "/v1/chat/completions": (
        {"model": "tiny", "messages": [{"role": "user", "content": "Count on:"}], "max_tokens": 4},
        lambda r: r["choices"][0]["message"]["content"],
    ),
    "/v1/completions": (
        {"model": "tiny", "prompt": "Count on:", "max_tokens": 4},
        lambda r: r["choices"][0]["text"],
    ),
    "/v1/responses": (
        {"model": "tiny", "input": "Count on:", "max_output_tokens": 4},
        lambda r: r["usage"]["output_tokens"],
    ),
    "/v1/messages": (
        {"model": "tiny", "messages": [{"role": "user", "content": "Count on:"}], "max_tokens": 4},
        lambda r: r["usage"]["output_tokens"],
    ),
}


@pytest.mark.parametrize("path", sorted(WITH_KEY))
def test_with_the_key_every_generation_route_generates_through_every_door(
    replicas: Replicas, path: str
) -> None:
    body, generated = WITH_KEY[path]
    with httpx.Client(timeout=120) as client:
        for entry in (replicas.router, *replicas.engines):
            reply = client.post(entry + path, json=body, headers=replicas.bearer)
            assert reply.status_code == 200, (entry, reply.text[:500])
            assert generated(reply.json()), (entry, reply.text[:500])


def requests_served(replicas: Replicas) -> float:
    total = 0.0
    for url in replicas.engines:
        with urllib.request.urlopen(url + "/metrics", timeout=30) as reply:
            for line in reply.read().decode().splitlines():
                if line.startswith("vllm:request_success_total"):
                    total += float(line.rsplit(" ", 1)[1])
    return total


def start_bench(replicas: Replicas, key: str, prompts: int, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, "bench", "--base-url", replicas.router, "--api-key", key,
         "--num-prompts", str(prompts), "--concurrency", "4", "--max-tokens", "16",
         "--temperature", "0", "--ignore-eos",
         "--repeats", "1", "--result-dir", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def wait_for(condition: object, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def finished_without_failures(bench: subprocess.Popen[str], out: Path) -> None:
    output, _ = bench.communicate(timeout=900)
    assert bench.returncode == 0, output[-3000:]
    (level,) = json.loads((out / "results.json").read_text())["levels"]
    assert level["failures"] == {}, level["failures"]


def test_a_key_rotation_while_benchmarks_run_loses_no_request(
    replicas: Replicas, routes: set[str], tmp_path: Path
) -> None:
    old, new = replicas.key, "sk-replicas-second-77ae"
    rotate = [*CLI, "local", "rotate-key", "--state-dir", str(replicas.state_dir)]
    served = requests_served(replicas)
    on_old = start_bench(replicas, old, 160, tmp_path / "old")
    wait_for(lambda: requests_served(replicas) > served, "the first bench served nothing")
    # Step 1: the doors accept the new key beside the old one; the clients move over.
    subprocess.run([*rotate, new], check=True, timeout=60)
    assert on_old.poll() is None, "the bench on the old key ended before the rotation"
    on_new = start_bench(replicas, new, 320, tmp_path / "new")
    finished_without_failures(on_old, tmp_path / "old")
    # Step 2: only the new key; the bench on it keeps running through the change.
    subprocess.run([*rotate, "--finish"], check=True, timeout=60)
    assert on_new.poll() is None, "the bench on the new key ended before the rotation finished"
    finished_without_failures(on_new, tmp_path / "new")
    replicas.key = new
    # The old key now opens nothing, through any entry.
    before = engine_tokens(replicas)
    problems = probe(replicas, routes, {"Authorization": f"Bearer {old}"})
    assert not problems, problems[:20]
    assert engine_tokens(replicas) == before


@dataclass
class Outcome:
    started: float
    ended: float
    ok: bool
    error: str | None


def tiny_tokenizer() -> Any:
    """The tiny pair's tokenizer (the models the replicas serve), built here if need be."""
    from dflash_ops.bench.core.token_counter import load_tokenizer
    from dflash_ops.local.tiny_model import train_tokenizer

    directory = Path(tempfile.gettempdir()) / f"dflash-serve-e2e-tokenizer-{os.getpid()}"
    if not (directory / "tokenizer.json").is_file():
        train_tokenizer(directory, 2048)
    return load_tokenizer(str(directory))


async def drive(
    router: str,
    key: str,
    seconds: float,
    served_before: int,
    kill: object,
    ejected: Callable[[], bool] | None = None,
) -> list[Outcome]:
    """Four clients streaming chats through the router for `seconds`; `kill()` runs once
    `served_before` requests were served and returns when the replica is dead. With `ejected`
    (the router took the dead replica out of rotation), the clients stop sooner: once it holds
    and 20 requests started after that were served."""
    endpoint = Endpoint(router, api_key=key)
    prompts = build(
        "shared-prefix", 400, RandomShape(input_len=80), 11, 8, tokenizer=tiny_tokenizer()
    )
    outcomes: list[Outcome] = []
    stop_at = time.monotonic() + seconds
    ejected_at: list[float] = []

    def served_enough() -> bool:
        if not ejected_at:
            return False
        return len([o for o in outcomes if o.ok and o.started > ejected_at[0]]) >= 20

    async def client(offset: int) -> None:
        i = offset
        while time.monotonic() < stop_at and not served_enough():
            started = time.monotonic()
            record = await endpoint.stream_chat("tiny", prompts[i % len(prompts)].messages, 24)
            outcomes.append(Outcome(started, time.monotonic(), record.ok, record.error))
            i += 4

    async def killer() -> None:
        # An event, not a time: a loaded machine serves fewer requests in a given time.
        while len([o for o in outcomes if o.ok]) < served_before:
            if time.monotonic() >= stop_at:
                return
            await asyncio.sleep(0.05)
        await asyncio.to_thread(kill)  # type: ignore[arg-type]
        while ejected is not None and time.monotonic() < stop_at:
            if await asyncio.to_thread(ejected):
                ejected_at.append(time.monotonic())
                return
            await asyncio.sleep(0.5)

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
        os.killpg(victim.pid, signal.SIGKILL)  # the API server and its engine core

    def ejected() -> bool:
        return replicas.gauge("vllm_router_worker_health", dead_url) == 0.0

    # Through the router's ejection of the dead replica and 20 requests after it, at most 60 s.
    outcomes = asyncio.run(drive(replicas.router, replicas.key, 120.0, 8, kill, ejected))
    (at,) = killed_at
    in_flight = [o for o in outcomes if o.started < at < o.ended]
    failed = [o for o in outcomes if not o.ok]
    assert len([o for o in outcomes if o.ended < at]) >= 8, "no traffic before the kill"
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
    back = asyncio.run(drive(replicas.router, replicas.key, 12.0, 0, lambda: None))
    assert all(o.ok for o in back), [o.error for o in back if not o.ok][:3]
    again = replicas.gauge("vllm_router_processed_requests_total", dead_url)
    assert again is not None and processed is not None and again > processed


def chart_router_termination() -> tuple[int, int]:
    """The router pod's grace period and preStop sleep, as the chart renders them."""
    import yaml

    text = helm_template([], ["router.enabled=true"], "t", "llm")
    (pod,) = [
        d["spec"]["template"]["spec"]
        for d in yaml.safe_load_all(text)
        if d and d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-router")
    ]
    (router,) = [c for c in pod["containers"] if c["name"] == "router"]
    return int(pod["terminationGracePeriodSeconds"]), int(
        router["lifecycle"]["preStop"]["exec"]["command"][1]
    )


def stream(
    replicas: Replicas, max_tokens: int, on_chunk: object = None, pace_s: float = 0.0
) -> tuple[str | None, int]:
    """A streamed completion through the router's door: its finish reason and tokens. The
    client reads token n no sooner than n * pace_s after the start (vLLM's per-chunk usage
    counts them): a slow reader, whose stream lasts as long on any machine."""
    payload = {
        "model": "tiny", "prompt": "Count on:", "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }  # fmt: skip
    finish, tokens, chunks = None, 0, 0
    started = time.monotonic()
    with httpx.stream(
        "POST", replicas.router + "/v1/completions", json=payload, headers=replicas.bearer,
        timeout=600,
    ) as reply:  # fmt: skip
        assert reply.status_code == 200, reply.read()
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices", []):
                chunks += 1
                finish = choice.get("finish_reason") or finish
            if event.get("usage"):
                tokens = int(event["usage"]["completion_tokens"])
            behind = started + tokens * pace_s - time.monotonic()
            if behind > 0:
                time.sleep(behind)
            if chunks == 5 and on_chunk is not None:
                on_chunk()  # type: ignore[operator]
    return finish, tokens


def test_a_router_stop_lets_a_60_second_stream_finish_within_the_charts_grace(
    replicas: Replicas,
) -> None:
    grace, pre_stop = chart_router_termination()
    # A stream that lasts at least 60 s on any machine: as many tokens as this machine makes in
    # 65 s (the rate of a short stream, measured now), at most 4,000, read at a pace that spreads
    # them over 65 s (the router and its door hold what the client has not read yet).
    started = time.monotonic()
    stream(replicas, 300)
    rate = 300 / (time.monotonic() - started)
    max_tokens = min(int(rate * 65), 4000)
    pace_s = 65 / max_tokens
    state = stack.load_state(replicas.state_dir)
    assert state is not None
    pids = {p.name: p.pid for p in state.processes}
    signalled: list[float] = []

    def stop_like_the_kubelet() -> None:
        # After the preStop sleep the kubelet stops both containers of the pod: the door
        # gracefully (its preStop: nginx -s quit), the router with SIGTERM.
        signalled.append(time.monotonic())
        os.kill(pids["door-router"], signal.SIGQUIT)
        os.kill(pids["router"], signal.SIGTERM)

    started = time.monotonic()
    finish, tokens = stream(replicas, max_tokens, stop_like_the_kubelet, pace_s)
    ended = time.monotonic()
    assert signalled, "the stream ended before the router was stopped"
    assert (finish, tokens) == ("length", max_tokens)
    assert ended - started >= 60, ended - started
    # Both processes are gone within what the pod's grace leaves after the preStop sleep.
    for name in ("router", "door-router"):
        record = next(p for p in state.processes if p.name == name)
        wait_for(lambda r=record: not supervisor.alive(r), f"{name} still runs", grace - pre_stop)
    assert time.monotonic() - signalled[0] <= grace - pre_stop
    # New connections are refused while it drains, not queued: nothing more to check here.
    done = subprocess.run(
        replicas.up_argv(), capture_output=True, text=True, timeout=600, env=QUIET_SIDECARS
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with httpx.Client(timeout=30) as client:
        wait_for(
            lambda: client.get(replicas.router + "/readiness").status_code == 200,
            "the restarted router never became ready",
        )


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
