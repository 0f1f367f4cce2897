"""The chart's monitoring, run for real: a Prometheus configured as the Prometheus Operator would
configure it from the chart's rendered PodMonitors (their relabelling included) and
PrometheusRule, scraping the local stack's real vLLM CPU engine and sidecar, and the real
vllm-router in front of that engine (the chart rendered with router.enabled), under load. Every
dashboard and rule expression must evaluate, the speculative-decoding panels and recording rules
must return data, a healthy engine must raise no alert, and the prometheus-adapter query behind
the HPA mode must return the queue per pod."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from dflash_ops.bench.core.client import Endpoint
from dflash_ops.bench.router_policies import Router
from dflash_ops.chart.helm import helm_template
from dflash_ops.local import stack
from dflash_ops.loopback import free_port

from tests.conftest import REPO_ROOT
from tests.e2e.prometheus_operator import LocalPod, rule_file, scrape_configs
from tests.ops.observability.promql_names import (
    ALL_SERIES_VARIABLES,
    dashboard_expressions,
    expand_grafana,
    metric_names,
)

pytestmark = pytest.mark.e2e

NAMESPACE, RELEASE = "llm", "dflash"
# Returns data only when a baseline deployment (role="baseline") runs beside this one.
NEEDS_BASELINE = {"DFlashSlowerThanBaseline"}


def query(prometheus: str, expr: str) -> list[dict]:  # type: ignore[type-arg]
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=30) as reply:
        body = json.load(reply)
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]  # type: ignore[no-any-return]


def rule_diagnosis(prometheus: str, names: list[str]) -> str:
    """For each recording rule in `names`: its health and last error as Prometheus evaluated it,
    and the latest sample of every series its expression reads (what a failure needs to show)."""
    with urllib.request.urlopen(f"{prometheus}/api/v1/rules?type=record", timeout=30) as reply:
        groups = json.load(reply)["data"]["groups"]
    lines = []
    for rule in (rule for group in groups for rule in group["rules"]):
        if rule["name"] not in names:
            continue
        lines.append(f"{rule['name']}: health {rule['health']} {rule.get('lastError', '')}")
        for name in sorted(metric_names(rule["query"])):
            samples = [(r["metric"], r["value"][1]) for r in query(prometheus, name)]
            lines.append(f"  {name}: {samples}")
    return "\n".join(lines)


def missing_metrics(prometheus: str, expr: str) -> set[str]:
    """Metric names in `expr` with no series in Prometheus (a misspelling shows up here)."""
    return {
        name
        for name in metric_names(expr)
        if not query(prometheus, f"count({{__name__={name!r}}})".replace("'", '"'))
    }


@pytest.fixture(scope="module")
def chart_monitoring() -> dict[str, dict]:  # type: ignore[type-arg]
    """The render's monitoring objects; the router's under keys of their own."""
    text = helm_template([], ["router.enabled=true"], RELEASE, NAMESPACE)
    found = {}
    for doc in yaml.safe_load_all(text):
        if doc and doc["kind"] in ("PodMonitor", "PrometheusRule", "Deployment"):
            router = doc["metadata"]["name"].endswith("-router")
            found[("Router" if router else "") + doc["kind"]] = doc
    return found


@pytest.fixture(scope="module")
def router(
    local_stack: stack.StackState, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The real vllm-router (cache_aware, as the chart's default) in front of the engine; yields
    its API URL. Its metrics port is the one its URL's port + the Router's metrics_port."""
    pytest.importorskip("vllm_router", reason="the router extra (vllm-router) is not installed")
    engine = next(p.url for p in local_stack.processes if p.name == "engine")
    log = tmp_path_factory.mktemp("router") / "router.log"
    with Router([engine], "cache_aware", log) as running:
        yield running


@pytest.fixture(scope="module")
def rules(chart_monitoring: dict[str, dict]) -> list[tuple[str, str]]:  # type: ignore[type-arg]
    """(name, expression) of every rule in the chart's rendered PrometheusRule."""
    return [
        (rule.get("record") or rule["alert"], rule["expr"])
        for group in chart_monitoring["PrometheusRule"]["spec"]["groups"]
        for rule in group["rules"]
    ]


@contextlib.contextmanager
def serving(process: subprocess.Popen[bytes], ready_url: str, log: Path) -> Iterator[None]:
    """Once `ready_url` answers (within 60 s, else the log's tail); SIGTERM after."""
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(ready_url, timeout=2)
                break
            except OSError:
                assert process.poll() is None, log.read_text()[-2000:]
                assert time.monotonic() < deadline, f"{ready_url} did not answer"
                time.sleep(0.5)
        yield
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


# The pod's sidecar for this module: the real sidecar, reading the session stack's engine, given
# a baseline with a step cost so that it recommends a k schedule and exports the dflash_schedule_*
# series the schedule panels and DFlashScheduleGainAvailable read (the session stack's own
# sidecar has no baseline: the other e2e tests judge it against the greedy constants). Its
# acceptance is set below what the tiny pair's draft (its target plus 5% noise) is accepted at,
# so the verdict stays healthy; the step cost is the unit tests' (drafting loses at large
# batches). Scraping every 0.5 s, it has the recommendation's 30 busy scrapes after 15 s of load.
ADVISING_BASELINE = {
    "model": "tiny", "num_speculative_tokens": 4, "mean_acceptance_length": 2.0,
    "per_position_acceptance": [0.4, 0.3, 0.2, 0.1],
    "sampling": "temperature 0 (greedy)", "workload": "the e2e load below",
    "step_cost": {
        "base_s": 0.020, "per_request_s": 0.0005, "per_draft_token_s": 0.0005,
        "drafting_s": 0.006, "fit_error_rms": 0.02, "fit_error_max": 0.05, "points": 12,
        "max_batch": 64,
    },
}  # fmt: skip


@pytest.fixture(scope="module")
def advising_sidecar(
    local_stack: stack.StackState, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[int]:
    """A sidecar with a step-cost baseline on the session engine; yields its port."""
    import sys

    work = tmp_path_factory.mktemp("advising-sidecar")
    baseline = work / "baseline.yaml"
    baseline.write_text(yaml.safe_dump(ADVISING_BASELINE))
    engine = next(p.url for p in local_stack.processes if p.name == "engine")
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "dflash_ops.cli", "sidecar", "--engine-url", engine,
         "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
         "--speculative-tokens", "4", "--baseline-file", str(baseline),
         "--scrape-interval", "0.5", "--scrape-timeout", "0.9"],
        stdout=subprocess.DEVNULL, stderr=(work / "sidecar.log").open("w"),
    )  # fmt: skip
    with serving(process, f"http://127.0.0.1:{port}/livez", work / "sidecar.log"):
        yield port


@pytest.fixture(scope="module")
def operator_prometheus(
    local_stack: stack.StackState,
    advising_sidecar: int,
    router: Router,
    chart_monitoring: dict[str, dict],  # type: ignore[type-arg]
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not installed: run `make setup`")
    ports = {p.name: int(p.url.rsplit(":", 1)[1]) for p in local_stack.processes}
    pod_template = chart_monitoring["Deployment"]["spec"]["template"]
    pod = LocalPod(
        namespace=NAMESPACE,
        name="dflash-dflash-serve-6c9f-r2x7",
        labels=pod_template["metadata"]["labels"],
        ports={"http": ("vllm", ports["engine"]), "sidecar": ("sidecar", advising_sidecar)},
    )
    router_pod = LocalPod(
        namespace=NAMESPACE,
        name="dflash-dflash-serve-router-5d8c-q9w2",
        labels=chart_monitoring["RouterDeployment"]["spec"]["template"]["metadata"]["labels"],
        ports={"metrics": ("router", router.metrics_port)},
    )
    configs = scrape_configs(chart_monitoring["PodMonitor"], pod)
    configs += scrape_configs(chart_monitoring["RouterPodMonitor"], router_pod)
    for config in configs:
        config["scrape_interval"] = "5s"  # the render says 15s: faster here, same relabelling
    work = tmp_path_factory.mktemp("operator-prometheus")
    rule_groups = rule_file(chart_monitoring["PrometheusRule"])
    for group in rule_groups["groups"]:
        group["interval"] = "5s"  # the render says 30s: evaluated faster here, same expressions
    (work / "rules.yaml").write_text(yaml.safe_dump(rule_groups))
    (work / "prometheus.yml").write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
                "rule_files": [str(work / "rules.yaml")],
                "scrape_configs": configs,
            }
        )
    )
    port = free_port()
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(work / "prometheus.log").open("w"),
    )
    url = f"http://127.0.0.1:{port}"
    with serving(process, f"{url}/-/ready", work / "prometheus.log"):
        yield url


@pytest.fixture(scope="module")
def prometheus_under_load(
    operator_prometheus: str, router: Router, rules: list[tuple[str, str]]
) -> str:
    """Load on the engine, through the router, until every recording rule has produced a series
    (at least 20 s: several 5 s scrapes and rule evaluations under load), with a deadline."""
    engine = router.url
    recorded = [name for name, _ in rules if name.startswith("dflash:")]
    # The schedule panels' series: exported once the sidecar has a recommendation.
    recorded += [
        "dflash_schedule_predicted_gain",
        "dflash_schedule_recommended_k",
        "dflash_schedule_step_cost_ratio",
    ]

    async def load(minimum: float, deadline: float) -> list[str]:
        endpoint = Endpoint(engine)
        start = time.monotonic()
        missing = recorded
        done = asyncio.Event()
        try:

            async def worker(i: int, max_tokens: int) -> None:
                while not done.is_set():
                    messages = [{"role": "user", "content": f"Count to ten, take {i}."}]
                    record = await endpoint.stream_chat("tiny", messages, max_tokens)
                    assert record.ok, record

            async def watch() -> None:
                nonlocal missing
                while time.monotonic() - start < deadline:
                    await asyncio.sleep(5)
                    missing = [
                        name
                        for name in missing
                        if not await asyncio.to_thread(query, operator_prometheus, name)
                    ]
                    if not missing and time.monotonic() - start >= minimum:
                        break
                done.set()

            # Short requests for the latency histograms, and one long one at a time so that a
            # request is running whenever Prometheus scrapes. vLLM sets num_requests_running
            # after each engine step, requests that step finished already removed, and not
            # between steps: after a short request it reads 0 until the next one's first step.
            # A machine loaded enough that the engine waits on the API server can have every
            # scrape land between requests, and the per-running-request rule, which divides by
            # the gauge's average, then has no series (the likely cause of its two failures
            # under stress-ng on two workers).
            workers = [worker(0, 1536)] + [worker(i, 32) for i in range(1, 3)]
            await asyncio.gather(watch(), *workers)
        finally:
            await endpoint.aclose()
        return missing

    missing = asyncio.run(load(20, 150))
    # p95 latencies need histogram samples in the window; all are present under load.
    assert not missing, (
        f"recording rules (or schedule series) without series after 150 s of load: {missing}\n"
        + rule_diagnosis(operator_prometheus, missing)
    )
    return operator_prometheus


def test_targets_carry_the_labels_the_dashboards_select_on(prometheus_under_load: str) -> None:
    up = query(prometheus_under_load, "up")
    assert {r["metric"]["endpoint"] for r in up} == {"http", "sidecar", "metrics"}
    for result in up:
        labels = result["metric"]
        assert result["value"][1] == "1", labels
        assert labels["namespace"] == NAMESPACE and labels["release"] == RELEASE
        if labels["endpoint"] == "metrics":  # the router's PodMonitor
            assert labels["job"] == f"{NAMESPACE}/dflash-dflash-serve-router"
            continue
        assert (
            labels["role"] == "speculative" and labels["job"] == f"{NAMESPACE}/dflash-dflash-serve"
        )


def test_speculative_dashboard_queries_return_data(prometheus_under_load: str) -> None:
    empty = []
    for board, title, expr in dashboard_expressions():
        expanded = expand_grafana(expr, ALL_SERIES_VARIABLES)
        result = query(prometheus_under_load, expanded)
        if board == "speculative-decoding.json" and not result:
            empty.append(f"{title}: {expanded}")
    assert not empty, "speculative-decoding panels without data:\n" + "\n".join(empty)


def test_every_metric_name_in_dashboards_and_rules_exists(
    prometheus_under_load: str, rules: list[tuple[str, str]]
) -> None:
    problems = []
    for _, title, expr in dashboard_expressions():
        if missing := missing_metrics(
            prometheus_under_load, expand_grafana(expr, ALL_SERIES_VARIABLES)
        ):
            problems.append(f"{title}: {sorted(missing)}")
    for name, expr in rules:
        if missing := missing_metrics(prometheus_under_load, expr):
            problems.append(f"{name}: {sorted(missing)}")
    assert not problems, "\n".join(problems)


def test_recording_rules_produce_series_for_this_release(
    prometheus_under_load: str, rules: list[tuple[str, str]]
) -> None:
    missing = [
        name
        for name, _ in rules
        if name.startswith("dflash:") and not query(prometheus_under_load, name)
    ]
    assert not missing, f"recording rules without series: {missing}"
    mal = query(prometheus_under_load, "dflash:spec_decode_mean_acceptance_length:rate5m")
    assert {r["metric"]["release"] for r in mal} == {RELEASE}
    assert 1 < float(mal[0]["value"][1]) <= 5  # k=4: at most 5


def test_alert_expressions_evaluate_and_a_healthy_engine_raises_none(
    prometheus_under_load: str, rules: list[tuple[str, str]]
) -> None:
    for _, expr in rules:
        query(prometheus_under_load, expr)  # status success: valid against real data
    assert {name for name, _ in rules} >= NEEDS_BASELINE
    firing = query(prometheus_under_load, 'ALERTS{alertstate="firing"}')
    assert not firing, [r["metric"]["alertname"] for r in firing]


def test_the_hpa_metric_query_returns_the_queue_per_pod(prometheus_under_load: str) -> None:
    config = yaml.safe_load(
        (REPO_ROOT / "ops" / "prometheus" / "prometheus-adapter-values.yaml").read_text()
    )
    rule = config["rules"]["custom"][0]
    chart = yaml.safe_load((REPO_ROOT / "charts" / "dflash-serve" / "values.yaml").read_text())
    assert rule["name"]["as"] == chart["autoscaling"]["podsMetricName"]
    assert query(prometheus_under_load, rule["seriesQuery"])
    # How the adapter expands its template for "this metric, for these pods of a namespace".
    expanded = (
        rule["metricsQuery"]
        .replace("<<.Series>>", "vllm:num_requests_waiting")
        .replace("<<.LabelMatchers>>", f'namespace="{NAMESPACE}",pod=~"dflash-dflash-serve-.*"')
        .replace("<<.GroupBy>>", "pod")
    )
    result = query(prometheus_under_load, expanded)
    assert [r["metric"] for r in result] == [{"pod": "dflash-dflash-serve-6c9f-r2x7"}]
    assert float(result[0]["value"][1]) >= 0


def test_a_misspelled_metric_fails_the_check(prometheus_under_load: str) -> None:
    expr = "sum(rate(vllm:spec_decode_num_drafs_total[1m]))"
    assert missing_metrics(prometheus_under_load, expr) == {"vllm:spec_decode_num_drafs_total"}
    assert query(prometheus_under_load, expr) == []


def test_the_local_stack_prometheus_loads_the_rules_file(local_stack: stack.StackState) -> None:
    """`make demo`'s own Prometheus loads ops/prometheus/rules as is (no chart scoping)."""
    url = next((p.url for p in local_stack.processes if p.name == "prometheus"), None)
    assert url is not None, "the local stack started without Prometheus"
    with urllib.request.urlopen(f"{url}/api/v1/rules", timeout=10) as reply:
        groups = json.load(reply)["data"]["groups"]
    source = yaml.safe_load(
        (REPO_ROOT / "ops" / "prometheus" / "rules" / "dflash-serve.rules.yaml").read_text()
    )
    assert sorted(g["name"] for g in groups) == sorted(g["name"] for g in source["groups"])
    assert all(r["health"] != "err" for g in groups for r in g["rules"])
