"""The benchmark through a router: counters summed over the replicas' own /metrics pages, and
each replica's share of the requests. The real vllm-router (round_robin) in front of two instant
OpenAI servers on real sockets; real CPU engines behind it run in tests/e2e."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator

import pytest
from dflash_ops.bench.core import report
from dflash_ops.bench.core.client import METRICS_TIMEOUT_S, Endpoint
from dflash_ops.bench.core.runner import Level, Target, run_bench

from tests.ops.bench.conftest import serve
from tests.ops.bench.test_bench import settings

pytest.importorskip("vllm_router", reason="the router extra (vllm-router) is not installed")


@pytest.fixture(scope="module")
def replicas() -> Iterator[list[str]]:
    first, second = serve("dflash_ops.bench.fake_server"), serve("dflash_ops.bench.fake_server")
    urls = [next(first), next(second)]
    yield urls
    for server in (first, second):
        next(server, None)


@pytest.fixture(scope="module")
def router(replicas: list[str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from dflash_ops.bench.router_policies import Router

    log = tmp_path_factory.mktemp("router") / "router.log"
    with Router(replicas, "round_robin", log) as running:
        yield running.url


async def drafts_of(urls: list[str]) -> float:
    endpoint = Endpoint(urls[0], metrics_urls=urls)
    try:
        counters = await endpoint.counters()
    finally:
        await endpoint.aclose()
    assert counters is not None
    return counters.drafts


def test_counters_are_summed_over_the_replicas_and_each_share_reported(
    router: str, replicas: list[str]
) -> None:
    before = [asyncio.run(drafts_of([url])) for url in replicas]
    result = asyncio.run(
        run_bench(
            Target(router), [Level(concurrency=2)], settings(repeats=1, metrics_urls=replicas)
        )
    )
    after = [asyncio.run(drafts_of([url])) for url in replicas]
    (level,) = result.levels
    assert level.replica_share is not None
    assert set(level.replica_share) == set(replicas)
    # round_robin: both replicas served; the shares are of the measured requests only.
    assert all(0.3 <= share <= 0.7 for share in level.replica_share.values()), level
    assert sum(level.replica_share.values()) == pytest.approx(1.0)
    # Acceptance counted over both replicas: the drafts of each moved, and the sum is reported.
    assert all(a > b for a, b in zip(after, before, strict=True))
    spec = level.spec_decode
    assert spec is not None and spec.mean_acceptance_length is not None
    text = report.markdown(result)
    assert "Counters read from 2 engine(s)" in text
    assert level.engines_counted == sorted(replicas) and level.engines_unread == []
    assert "requests finished per engine" in text


def test_one_engine_reports_no_share(replicas: list[str]) -> None:
    result = asyncio.run(
        run_bench(Target(replicas[0]), [Level(concurrency=1)], settings(repeats=1))
    )
    assert result.levels[0].replica_share is None


def test_a_bad_metrics_url_is_refused_by_name(replicas: list[str]) -> None:
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "dflash_ops.cli",
            "bench",
            "run",
            "--base-url",
            replicas[0],
            "--metrics-url",
            "ftp://x",
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "--metrics-url" in bad.stderr


def test_a_replica_whose_metrics_hang_is_left_out_by_name_within_seconds(
    router: str, replicas: list[str], scripted_server: str
) -> None:
    """A hung /metrics stalled the run for the request timeout (66.8 s for 0.6 s of requests),
    and results.md still said the counters were summed over every engine."""
    import time

    hung = f"{scripted_server}/hang"
    started = time.monotonic()
    result = asyncio.run(
        run_bench(
            Target(router),
            [Level(concurrency=2)],
            settings(repeats=1, metrics_urls=[*replicas, hung]),
        )
    )
    # Two snapshots (before and after the pass), each waiting at most METRICS_TIMEOUT_S for it.
    assert time.monotonic() - started < 4 * METRICS_TIMEOUT_S + 10
    (level,) = result.levels
    assert level.engines_unread == [hung] and level.engines_counted == sorted(replicas)
    assert level.spec_decode is not None  # the two that answered
    text = report.markdown(result)
    assert f"left out, its /metrics unread at some snapshot: {hung}" in text
