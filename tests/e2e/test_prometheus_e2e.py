"""Every dashboard and rule expression against a real Prometheus scraping the real engine and
sidecar of the local stack, under load. Speculative-decoding expressions must return data."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
import urllib.request

import pytest
from dflash_ops.bench.client import Endpoint
from dflash_ops.local import stack
from dflash_ops.promql_names import (
    ALL_SERIES_VARIABLES,
    dashboard_expressions,
    expand_grafana,
    metric_names,
    rule_expressions,
)

pytestmark = pytest.mark.e2e

# Returns data only when a baseline deployment (role="baseline") runs beside this one.
NEEDS_BASELINE = {"DFlashSlowerThanBaseline"}


def query(prometheus: str, expr: str) -> list[dict]:  # type: ignore[type-arg]
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=30) as reply:
        body = json.load(reply)
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]  # type: ignore[no-any-return]


def missing_metrics(prometheus: str, expr: str) -> set[str]:
    """Metric names in `expr` with no series in Prometheus (a misspelling shows up here)."""
    return {
        name
        for name in metric_names(expr)
        if not query(prometheus, f"count({{__name__={name!r}}})".replace("'", '"'))
    }


@pytest.fixture(scope="module")
def prometheus_under_load(local_stack: stack.StackState) -> str:
    prometheus = next((p.url for p in local_stack.processes if p.name == "prometheus"), None)
    if prometheus is None:
        pytest.fail("the local stack started without Prometheus (is `prometheus` installed?)")
    engine = next(p.url for p in local_stack.processes if p.name == "engine")

    async def load(seconds: float) -> None:
        endpoint = Endpoint(engine)
        deadline = time.monotonic() + seconds
        try:

            async def worker(i: int) -> None:
                while time.monotonic() < deadline:
                    await endpoint.chat("tiny", f"Count to ten, take {i}.", 32)

            await asyncio.gather(*(worker(i) for i in range(3)))
        finally:
            await endpoint.aclose()

    asyncio.run(load(75))  # several 5 s scrapes and two 30 s rule evaluations under load
    return prometheus


def test_speculative_dashboard_queries_return_data(prometheus_under_load: str) -> None:
    empty = []
    for board, title, expr in dashboard_expressions():
        expanded = expand_grafana(expr, ALL_SERIES_VARIABLES)
        result = query(prometheus_under_load, expanded)
        if board == "speculative-decoding.json" and not result:
            empty.append(f"{title}: {expanded}")
    assert not empty, "speculative-decoding panels without data:\n" + "\n".join(empty)


def test_every_metric_name_in_dashboards_and_rules_exists(prometheus_under_load: str) -> None:
    problems = []
    for _, title, expr in dashboard_expressions():
        if missing := missing_metrics(
            prometheus_under_load, expand_grafana(expr, ALL_SERIES_VARIABLES)
        ):
            problems.append(f"{title}: {sorted(missing)}")
    for name, expr in rule_expressions():
        if missing := missing_metrics(prometheus_under_load, expr):
            problems.append(f"{name}: {sorted(missing)}")
    assert not problems, "\n".join(problems)


def test_recording_rules_produce_series(prometheus_under_load: str) -> None:
    deadline = time.monotonic() + 90
    missing = [name for name, _ in rule_expressions() if name.startswith("dflash:")]
    while missing and time.monotonic() < deadline:
        missing = [name for name in missing if not query(prometheus_under_load, name)]
        time.sleep(5)
    # p95 latencies need histogram samples in the window; all are present under load.
    assert not missing, f"recording rules without series: {missing}"


def test_alert_expressions_evaluate(prometheus_under_load: str) -> None:
    for name, expr in rule_expressions():
        query(prometheus_under_load, expr)  # status success: valid against real data
        if name == "DFlashAcceptanceCollapse":
            # the left-hand side is live data: the healthy local draft sits above the threshold
            mal = query(prometheus_under_load, "dflash:spec_decode_mean_acceptance_length:rate5m")
            assert mal and float(mal[0]["value"][1]) > 1.2
    assert {name for name, _ in rule_expressions()} >= NEEDS_BASELINE


def test_a_misspelled_metric_fails_the_check(prometheus_under_load: str) -> None:
    expr = "sum(rate(vllm:spec_decode_num_drafs_total[1m]))"
    assert missing_metrics(prometheus_under_load, expr) == {"vllm:spec_decode_num_drafs_total"}
    assert query(prometheus_under_load, expr) == []
