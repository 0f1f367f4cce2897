"""Alerts judged on what the real sidecar reports: scenarios replayed through promtool.

The real sidecar process watches a scripted engine on a real socket and is driven into each
state: loading (port refusing connections), serving with traffic, idle, acceptance collapsed,
answering /health without generating, killed after serving, and never up within its startup
budget. Its /metrics (and the engine's) are captured in each state and labelled as the
Prometheus Operator would label them for the chart's PodMonitor; scenarios string the states
into timelines (e.g. 15 minutes of traffic, then the engine killed) and promtool evaluates the
chart's rendered PrometheusRule over them. Who gets paged must follow:

- an engine loading for 40 minutes pages nobody; one that never comes up pages after its budget;
- an engine killed after serving pages within 5 minutes;
- collapsed acceptance pages; an idle engine pages nobody.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from dflash_ops.chart.helm import helm_template
from dflash_ops.loopback import free_port
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import find_tool
from tests.service.fake_engine_server import FakeEngineServer, wait_until

STEP_S = 15  # the PodMonitor's scrape interval
POD = {
    "namespace": "llm",
    "pod": "dflash-dflash-serve-7d9f-x2k4",
    "release": "dflash",
    "role": "speculative",
    "job": "llm/dflash-dflash-serve",
}
TARGETS = {
    "sidecar": POD | {"container": "sidecar", "endpoint": "sidecar", "instance": "10.1.2.3:9100"},
    "engine": POD | {"container": "vllm", "endpoint": "http", "instance": "10.1.2.3:8000"},
}

Series = tuple[str, tuple[tuple[str, str], ...]]


@dataclass
class Page:
    at: float
    values: dict[Series, float]
    counters: set[Series]


@dataclass
class Capture:
    sidecar: tuple[Page, Page]
    engine: tuple[Page, Page] | None  # None: the engine refuses connections


def read_page(text: str, at: float, target: str) -> Page:
    values: dict[Series, float] = {}
    counters: set[Series] = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            labels = {**sample.labels, **TARGETS[target]}
            key = (sample.name, tuple(sorted(labels.items())))
            values[key] = float(sample.value)
            if family.type in ("counter", "histogram", "summary"):
                counters.add(key)
    return Page(at, values, counters)


def get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return str(reply.read().decode())
    except urllib.error.HTTPError as err:
        return str(err.read().decode())
    except OSError:
        return None


class Sidecar:
    """The real `dflash-serve sidecar` process, with fast intervals."""

    def __init__(
        self, engine_port: int, startup_budget: float, env: dict[str, str] | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dflash_ops.cli",
                "sidecar",
                "--engine-url",
                f"http://127.0.0.1:{engine_port}",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--scrape-interval",
                "0.25",
                "--scrape-timeout",
                "0.4",
                "--windows",
                "5s,10s,30s",
                "--verdict-window",
                "5s",
                "--canary-interval",
                "0.5",
                "--log-level",
                "warning",
            ],
            env=os.environ | {"DFLASH_SIDECAR_STARTUP_BUDGET": str(startup_budget)} | (env or {}),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(lambda: get(f"{self.url}/livez") is not None, 30, "sidecar start")

    def state(self) -> str:
        body = get(f"{self.url}/readyz") or ""
        return yaml.safe_load(body).get("state", "") if body.startswith("{") else ""

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def capture(sidecar: Sidecar, engine: FakeEngineServer | None, gap_s: float = 2.0) -> Capture:
    pages: list[Page] = []
    engine_pages: list[Page] = []
    for page in range(2):
        if page:
            time.sleep(gap_s)
        at = time.monotonic()
        text = get(f"{sidecar.url}/metrics")
        assert text is not None
        pages.append(read_page(text, at, "sidecar"))
        engine_text = get(f"{engine.url}/metrics") if engine is not None else None
        if engine_text is not None:
            engine_pages.append(read_page(engine_text, at, "engine"))
    return Capture(
        sidecar=(pages[0], pages[1]),
        engine=(engine_pages[0], engine_pages[1]) if len(engine_pages) == 2 else None,
    )


@pytest.fixture(scope="module")
def captures() -> Iterator[dict[str, Capture]]:
    found: dict[str, Capture] = {}
    reserved = socket.socket()
    reserved.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
    port = int(reserved.getsockname()[1])
    sidecar = Sidecar(port, startup_budget=3600)
    engine: FakeEngineServer | None = None
    try:
        wait_until(lambda: sidecar.state() == "starting", 10, "loading state")
        found["loading"] = capture(sidecar, None)
        reserved.close()
        engine = FakeEngineServer(port)
        engine.load = "traffic"
        wait_until(lambda: sidecar.state() == "serving", 20, "serving state")
        time.sleep(1)
        found["traffic"] = capture(sidecar, engine)
        engine.load = "idle"
        time.sleep(1)
        found["idle"] = capture(sidecar, engine)
        engine.load = "collapsed"
        time.sleep(1)
        found["collapsed"] = capture(sidecar, engine)
        engine.load, engine.completion_status = "idle", 500
        wait_until(lambda: sidecar.state() == "not_generating", 20, "not_generating state")
        found["not_generating"] = capture(sidecar, engine)
        engine.completion_status = 200
        engine.stop()
        engine = None
        wait_until(lambda: sidecar.state() == "down", 10, "down state")
        found["killed"] = capture(sidecar, None)
    finally:
        sidecar.close()
        if engine is not None:
            engine.stop()
        reserved.close()
    never = Sidecar(free_port(), startup_budget=1)
    try:
        wait_until(lambda: never.state() == "start_timeout", 20, "start_timeout state")
        found["start_timeout"] = capture(never, None)
    finally:
        never.close()
    yield found


def input_series(
    captures: dict[str, Capture], timeline: list[tuple[str, int]]
) -> list[dict[str, str]]:
    """promtool input series for a timeline of (state, minutes)."""
    steps: list[tuple[Capture, int]] = []
    for state, minutes in timeline:
        steps += [(captures[state], i) for i in range(minutes * 60 // STEP_S)]
    keys: set[Series] = set()
    for capture_ in captures.values():
        keys |= set(capture_.sidecar[0].values)
        if capture_.engine is not None:
            keys |= set(capture_.engine[0].values)
    series: dict[Series, list[str]] = {key: [] for key in keys}
    last: dict[Series, float] = {}
    up = {"sidecar": [], "engine": []}  # type: dict[str, list[str]]
    for capture_, i in steps:
        up["sidecar"].append("1")
        up["engine"].append("0" if capture_.engine is None else "1")
        for key in keys:
            pages = capture_.sidecar if key in capture_.sidecar[0].values else capture_.engine
            if pages is None or key not in pages[0].values:
                series[key].append("_")
                continue
            first, second = pages
            if key in first.counters:
                rate = (second.values.get(key, first.values[key]) - first.values[key]) / (
                    second.at - first.at
                )
                base = last.get(key, first.values[key])
                value = base + (rate * STEP_S if i else 0.0)
            else:
                value = second.values.get(key, first.values[key])
            last[key] = value
            series[key].append(repr(value))
    rendered = []
    for (name, labels), values in series.items():
        if all(v == "_" for v in values):
            continue
        label_text = ",".join(f'{k}="{v}"' for k, v in labels)
        rendered.append({"series": f"{name}{{{label_text}}}", "values": " ".join(values)})
    for target, values in up.items():
        label_text = ",".join(f'{k}="{v}"' for k, v in sorted(TARGETS[target].items()))
        rendered.append({"series": f"up{{{label_text}}}", "values": " ".join(values)})
    return rendered


def rules_file(text: str, directory: Path) -> Path:
    """The PrometheusRule of a chart render, as the Prometheus Operator hands it to Prometheus."""
    rule = next(d for d in yaml.safe_load_all(text) if d and d["kind"] == "PrometheusRule")
    path = directory / "dflash-serve.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


@pytest.fixture(scope="module")
def rendered_rules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return rules_file(helm_template([], [], "dflash", "llm"), tmp_path_factory.mktemp("rules"))


SCENARIOS = [
    # (name, timeline, [(eval minute, {alertname: firing series})])
    ("loading for 40 minutes pages nobody", [("loading", 40)], [(40, {})]),
    (
        "never up within the startup budget pages",
        [("start_timeout", 20)],
        [(4, {}), (10, {"DFlashEngineStartTimeout": 1})],
    ),
    (
        "killed after serving pages within 5 minutes",
        [("traffic", 15), ("killed", 20)],
        [(15, {}), (20, {"DFlashEngineDown": 1})],
    ),
    (
        "collapsed acceptance pages",
        [("traffic", 10), ("collapsed", 30)],
        [(10, {}), (35, {"DFlashAcceptanceCollapse": 1, "DFlashPosition0Drop": 1})],
    ),
    ("idle pages nobody", [("traffic", 10), ("idle", 40)], [(20, {}), (50, {})]),
    (
        "healthy without generating warns",
        [("traffic", 10), ("not_generating", 20)],
        [(15, {}), (25, {"DFlashEngineNotGenerating": 1})],
    ),
]


def promtool_scenario(
    captures: dict[str, Capture],
    rules: Path,
    tmp_path: Path,
    name: str,
    timeline: list[tuple[str, int]],
    checks: list[tuple[int, dict[str, int]]],
) -> None:
    test = {
        "rule_files": [str(rules)],
        "evaluation_interval": f"{STEP_S}s",
        "tests": [
            {
                "name": name,
                "interval": f"{STEP_S}s",
                "input_series": input_series(captures, timeline),
                "promql_expr_test": [
                    {
                        "expr": 'count by (alertname) (ALERTS{alertstate="firing"})',
                        "eval_time": f"{minute}m",
                        "exp_samples": [
                            {"labels": f'{{alertname="{alert}"}}', "value": count}
                            for alert, count in sorted(expected.items())
                        ],
                    }
                    for minute, expected in checks
                ],
            }
        ],
    }
    path = tmp_path / "scenario.test.yaml"
    path.write_text(yaml.safe_dump(test, width=1_000_000))
    result = subprocess.run(
        [find_tool("promtool"), "test", "rules", str(path)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


@pytest.mark.parametrize(("name", "timeline", "checks"), SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_who_gets_paged(
    captures: dict[str, Capture],
    rendered_rules: Path,
    tmp_path: Path,
    name: str,
    timeline: list[tuple[str, int]],
    checks: list[tuple[int, dict[str, int]]],
) -> None:
    promtool_scenario(captures, rendered_rules, tmp_path, name, timeline, checks)


def chart_overrides(sets: list[str]) -> dict[str, object]:
    """`a.b.c=1.6` assignments as a values document (numbers stay numbers)."""
    values: dict[str, object] = {}
    for item in sets:
        path, _, raw = item.partition("=")
        *parents, leaf = path.split(".")
        node = values
        for key in parents:
            node = node.setdefault(key, {})  # type: ignore[assignment]
        node[leaf] = yaml.safe_load(raw)
    return values


def sidecar_threshold_env(render: str) -> dict[str, str]:
    """The verdict thresholds the chart hands its sidecar container."""
    deployment = next(d for d in yaml.safe_load_all(render) if d and d["kind"] == "Deployment")
    (sidecar,) = (
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "sidecar"
    )
    return {
        e["name"]: e["value"]
        for e in sidecar["env"]
        if e["name"].endswith(("_MEAN_ACCEPTANCE_LENGTH", "_POSITION0"))
    }


@pytest.mark.parametrize(
    ("sets", "verdict", "paged"),
    [
        ([], "degraded", {}),
        (
            ["sidecar.thresholds.collapsedMeanAcceptanceLength=1.6"],
            "collapsed",
            {"DFlashAcceptanceCollapse": 1},
        ),
    ],
    ids=["default-thresholds", "collapse-threshold-1.6"],
)
def test_verdict_and_alerts_follow_the_thresholds_in_the_values(
    tmp_path: Path, sets: list[str], verdict: str, paged: dict[str, int]
) -> None:
    """A draft at mean acceptance length 1.5: with the chart's default thresholds the sidecar
    says degraded and nobody is paged; raise sidecar.thresholds.collapsedMeanAcceptanceLength
    to 1.6 and the same traffic is collapsed for the sidecar and pages through the rules the
    chart renders from the same values."""
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(chart_overrides(sets)))
    render = helm_template([values], [], "dflash", "llm")
    engine = FakeEngineServer()
    sidecar = Sidecar(engine.port, startup_budget=3600, env=sidecar_threshold_env(render))
    try:
        engine.load = "weak"
        wait_until(lambda: sidecar.state() == "serving", 20, "serving state")
        time.sleep(1.5)
        stats = yaml.safe_load(get(f"{sidecar.url}/stats") or "{}")
        assert stats["windows"]["5s"]["verdict"] == verdict, stats["windows"]["5s"]
        found = {"weak": capture(sidecar, engine)}
    finally:
        sidecar.close()
        engine.stop()
    promtool_scenario(
        found,
        rules_file(render, tmp_path),
        tmp_path,
        "thresholds follow the values",
        [("weak", 30)],
        [(25, paged)],
    )


def test_the_captured_states_are_the_ones_named(captures: dict[str, Capture]) -> None:
    for state, capture_ in captures.items():
        page = capture_.sidecar[1].values
        current = {
            dict(labels)["state"]
            for (name, labels), value in page.items()
            if name == "dflash_engine_state" and value == 1
        }
        expected = {
            "loading": "starting",
            "traffic": "serving",
            "idle": "serving",
            "collapsed": "serving",
            "killed": "down",
        }.get(state, state)
        assert current == {expected}, state
