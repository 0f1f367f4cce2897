"""Which of vLLM's router policies keeps prefix-cache hits when one model is served by several
replicas: N CPU engines of the local stack, the real `vllm-router` in front with each policy in
turn, the shared-prefix prompt set with several prefix groups sent through it.

For every run the prefix-cache hit rate is summed over the replicas from their own /metrics
deltas, each replica's share of requests from the requests it finished
(`vllm:request_success_total`: the router counts them for some policies only), and TTFT and
throughput come from the benchmark. kv_aware is fed by the engines' KV-cache events (ZMQ). A
single replica alone gives the reference hit rate. Every run uses fresh prefixes (its own seed),
so no run profits from what an earlier one left in the caches.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pydantic import BaseModel, Field

from dflash_ops.bench.core.client import Endpoint
from dflash_ops.bench.core.results import BenchSettings
from dflash_ops.bench.core.runner import Level, Target, run_bench
from dflash_ops.errors import UserError
from dflash_ops.local import stack
from dflash_ops.local.router import router_argv
from dflash_ops.local.supervisor import http_ok
from dflash_ops.loopback import free_port

_BLOCK_SIZE = re.compile(r'^vllm:cache_config_info\{[^}]*\bblock_size="(\d+)"', re.M)


class PolicyRun(BaseModel):
    policy: str  # "single replica" for the reference
    hit_rate: float | None
    hit_tokens: float
    queried_tokens: float
    share: dict[str, float]  # replica URL -> share of requests
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    output_tokens_per_s: float
    failed: int


class RouterPolicyReport(BaseModel):
    router_args: list[str] = []
    scale_out: bool = Field(description="engines served vLLM's render endpoints")
    replicas: int
    prefix_groups: int
    requests: int
    runs: list[PolicyRun]


def say(message: str) -> None:
    print(f"==> router policies: {message}", file=sys.stderr, flush=True)


class Router:
    def __init__(
        self, workers: list[str], policy: str, log: Path, extra: list[str] | None = None
    ) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = router_argv(workers, policy, self.port, self.metrics_port, extra)
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Router:
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + 60
        while not http_ok(self.url + "/health"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-1500:]
                raise UserError(f"vllm-router did not start ({self.log}):\n{tail}")
            time.sleep(0.5)
        return self

    def metrics(self) -> str:
        import urllib.request

        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as reply:
            return str(reply.read().decode())

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            # Its routing decisions, for whoever wants to know why it routed as it did.
            with contextlib.suppress(OSError):
                self.log.with_suffix(".metrics").write_text(self.metrics())
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


async def _counters(urls: list[str]) -> tuple[float, float, dict[str, float]]:
    """(prefix-cache hit tokens, queried tokens) summed over the engines, and the requests
    each engine finished (its own vllm:request_success_total: the router counts them for some
    policies only)."""
    hits = queries = 0.0
    finished: dict[str, float] = {}
    for url in urls:
        endpoint = Endpoint(url)
        try:
            text = await endpoint.metrics_text()
        finally:
            await endpoint.aclose()
        found = Endpoint.prefix_cache_of(text)
        if found is None:
            raise UserError(f"{url} exports no vllm:prefix_cache_* counters")
        hits, queries = hits + found[0], queries + found[1]
        finished[url] = Endpoint.finished_requests_of(text) or 0.0
    return hits, queries, finished


async def _block_size(url: str) -> int:
    """The engine's KV block size, from its vllm:cache_config_info."""
    endpoint = Endpoint(url)
    try:
        text = await endpoint.metrics_text() or ""
    finally:
        await endpoint.aclose()
    found = _BLOCK_SIZE.search(text)
    if found is None:
        raise UserError(f"{url} reports no block_size in vllm:cache_config_info")
    return int(found.group(1))


def one_run(
    policy: str, target: str, engines: list[str], settings: BenchSettings, concurrency: int,
    router: Router | None,
) -> PolicyRun:  # fmt: skip
    before = asyncio.run(_counters(engines))
    result = asyncio.run(
        run_bench(Target(target, stack.SERVED_MODEL), [Level(concurrency)], settings)
    )
    after = asyncio.run(_counters(engines))
    level = result.levels[0]
    hits, queries = after[0] - before[0], after[1] - before[1]
    share: dict[str, float] = {}
    if router is not None:
        done = {url: after[2][url] - before[2].get(url, 0.0) for url in engines}
        total = sum(done.values()) or 1.0
        share = {url: n / total for url, n in done.items() if n > 0}
    return PolicyRun(
        policy=policy,
        hit_rate=hits / queries if queries else None,
        hit_tokens=hits,
        queried_tokens=queries,
        share=share,
        ttft_p50_ms=level.ttft_ms.p50 if level.ttft_ms else None,
        ttft_p99_ms=level.ttft_ms.p99 if level.ttft_ms else None,
        output_tokens_per_s=level.output_tokens_per_s.mean,
        failed=sum(r.failed for r in level.runs),
    )


def measure(
    state_root: Path,
    replicas: int,
    policies: list[str],
    prefix_groups: int,
    requests: int,
    concurrency: int,
    input_len: int,
    max_tokens: int,
    enforce_eager: bool,
    router_args: list[str] | None = None,
    scale_out: bool = True,
) -> RouterPolicyReport:
    state_root.mkdir(parents=True, exist_ok=True)
    models = state_root / "models"
    models.mkdir(exist_ok=True)
    dirs = [state_root / f"replica-{i}" for i in range(replicas)]
    runs: list[PolicyRun] = []
    kv_sources: list[str] = []
    # The replicas start together (each start is its own imports, model load and compile), the
    # models they share built first.
    starting = ThreadPoolExecutor(max_workers=replicas)
    try:
        configs, events_ports = [], []
        for state_dir in dirs:
            state_dir.mkdir(exist_ok=True)
            if not (state_dir / "models").exists():
                (state_dir / "models").symlink_to(models.resolve())
            events = free_port() if "kv_aware" in policies else None
            events_ports.append(events)
            configs.append(
                stack.StackConfig(
                    state_dir=state_dir, engine_port=free_port(), sidecar_port=free_port(),
                    method="off", prometheus=False, enforce_eager=enforce_eager,
                    scale_out=scale_out, kv_events_port=events,
                    engine_threads=stack.engine_threads(replicas),
                )
            )  # fmt: skip
        stack.ensure_models(configs[0])
        say(f"starting {replicas} replicas")
        started = [starting.submit(stack.up, config) for config in configs]
        engines = []
        for future, events in zip(started, events_ports, strict=True):
            state = future.result()
            engines.append(next(p.url for p in state.processes if p.name == "engine"))
            if events is not None:
                kv_sources.append(f"--kv-event-source={engines[-1]}=tcp://127.0.0.1:{events}")

        def settings(seed: int) -> BenchSettings:
            return BenchSettings(
                prompt_set="shared-prefix", input_len=input_len, max_tokens=max_tokens,
                num_requests=requests, duration_s=None, repeats=1, warmup=0, seed=seed,
                prefix_groups=prefix_groups,
            )  # fmt: skip

        say("single replica (the reference hit rate)")
        runs.append(one_run("single replica", engines[0], engines, settings(1), concurrency, None))
        for seed, policy in enumerate(policies, start=2):
            say(f"{policy} over {replicas} replicas")
            log = state_root / f"router-{policy}.log"
            extra = list(router_args or [])
            if policy == "kv_aware":
                # The router hashes the prompt's tokens in blocks of the engines' block size to
                # match the hashes of the blocks the engines report stored.
                block = asyncio.run(_block_size(engines[0]))
                extra += [*kv_sources, "--kv-event-block-size", str(block)]
                extra += ["--kv-event-model", stack.SERVED_MODEL]
            with Router(engines, policy, log, extra) as router:
                runs.append(
                    one_run(policy, router.url, engines, settings(seed), concurrency, router)
                )
    finally:
        for state_dir in dirs:
            stack.down(state_dir, quiet=True)
        # A replica still starting (another failed, or Ctrl-C) sees its engine stopped and
        # returns; what one spawned after the first stop is stopped once they all returned.
        starting.shutdown(wait=True, cancel_futures=True)
        for state_dir in dirs:
            stack.down(state_dir, quiet=True)
    return RouterPolicyReport(
        router_args=router_args or [],
        scale_out=scale_out,
        replicas=replicas,
        prefix_groups=prefix_groups,
        requests=requests,
        runs=runs,
    )


def table(report: RouterPolicyReport) -> str:
    single = next((r for r in report.runs if r.policy == "single replica"), None)
    lines = [
        f"{report.replicas} replicas, shared-prefix set with {report.prefix_groups} prefix groups, "
        f"{report.requests} requests per run",
        "",
        "| policy | prefix-cache hit rate | vs single replica | requests per replica | TTFT p50 "
        "/ p99 ms | output tok/s | failed |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for run in report.runs:
        ratio = (
            f"{run.hit_rate / single.hit_rate:.2f}x"
            if single and single.hit_rate and run.hit_rate is not None
            else "n/a"
        )
        share = ", ".join(f"{v:.0%}" for v in run.share.values()) or "all on one"
        ttft = (
            f"{run.ttft_p50_ms:.0f} / {run.ttft_p99_ms:.0f}"
            if run.ttft_p50_ms is not None and run.ttft_p99_ms is not None
            else "n/a"
        )
        rate = "n/a" if run.hit_rate is None else f"{run.hit_rate:.3f}"
        lines.append(
            f"| {run.policy} | {rate} | {ratio} | {share} | {ttft} | "
            f"{run.output_tokens_per_s:.1f} | {run.failed} |"
        )
    return "\n".join(lines) + "\n"
