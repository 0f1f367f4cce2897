"""Alert rules (promtool), dashboards (structure, generated, parseable PromQL)."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml
from dflash_ops import dashboards
from dflash_ops.promql_names import (
    ALL_SERIES_VARIABLES,
    DASHBOARD_DIR,
    RULES_DIR,
    dashboard_expressions,
    expand_grafana,
    metric_names,
    rule_expressions,
)

from tests.conftest import REPO_ROOT, find_tool


def test_promtool_checks_the_rules() -> None:
    files = [str(p) for p in RULES_DIR.glob("*.yaml")]
    result = subprocess.run(
        [find_tool("promtool"), "check", "rules", *files], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_fire_and_stay_silent() -> None:
    tests = sorted((REPO_ROOT / "ops" / "prometheus" / "tests").glob("*.yaml"))
    result = subprocess.run(
        [find_tool("promtool"), "test", "rules", *map(str, tests)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    alerts = {name for name, _ in rule_expressions() if not name.startswith("dflash:")}
    tested = set(re.findall(r"alertname: (\w+)", "".join(t.read_text() for t in tests)))
    assert alerts == tested, f"alerts without promtool tests: {alerts - tested}"


def test_every_alert_has_summary_description_and_a_runbook_section() -> None:
    runbook = (REPO_ROOT / "ops" / "prometheus" / "RUNBOOK.md").read_text()
    sections = {line[3:].strip().lower() for line in runbook.splitlines() if line.startswith("## ")}
    for path in RULES_DIR.glob("*.yaml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" not in rule:
                    continue
                annotations = rule["annotations"]
                assert annotations["summary"] and annotations["description"], rule["alert"]
                anchor = annotations["runbook_url"].rsplit("#", 1)[1]
                assert anchor == rule["alert"].lower() and anchor in sections, rule["alert"]
                assert rule["labels"]["severity"] in ("warning", "critical")


def test_dashboards_are_generated_from_the_source() -> None:
    for name, text in dashboards.render().items():
        assert (DASHBOARD_DIR / name).read_text() == text, (
            f"{name} is stale: python -m dflash_ops.dashboards"
        )


@pytest.mark.parametrize("name", sorted(dashboards.DASHBOARDS))
def test_every_panel_has_unit_description_and_queries(name: str) -> None:
    board = json.loads((DASHBOARD_DIR / name).read_text())
    variables = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "namespace", "release", "pod", "model"} <= variables
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert panel["description"], panel["title"]
        assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        assert panel["targets"], panel["title"]


def test_every_expression_parses_and_names_known_families() -> None:
    known_prefixes = ("vllm:", "dflash_", "dflash:")
    expressions = [e for _, e in rule_expressions()] + [
        expand_grafana(e, ALL_SERIES_VARIABLES) for _, _, e in dashboard_expressions()
    ]
    for expr in expressions:
        names = metric_names(expr)
        assert names and all(n.startswith(known_prefixes) for n in names), (expr, names)


def test_metric_name_extraction_sees_a_misspelling() -> None:
    assert metric_names("sum(rate(vllm:spec_decode_num_drafs_total[5m]))") == {
        "vllm:spec_decode_num_drafs_total"
    }
