"""Metric names in the dashboards' and rules' PromQL, and Grafana variable expansion."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml
from dflash_ops.paths import DASHBOARDS_DIR as DASHBOARD_DIR
from dflash_ops.paths import RULES_DIR


def metric_names(expr: str) -> set[str]:
    import promql_parser

    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            return
        for attr in ("lhs", "rhs", "expr", "param", "vector_selector"):
            child = getattr(node, attr, None)
            if child is not None:
                visit(child)
        for child in getattr(node, "args", None) or []:
            visit(child)

    visit(promql_parser.parse(expr))
    return names


# Variable values that select everything a test Prometheus holds (the baseline panels compare
# the release with itself).
ALL_SERIES_VARIABLES = {
    "namespace": ".*",
    "release": ".*",
    "pod": ".*",
    "model": ".*",
    "engine": ".*",
    "baseline": ".*",
    "datasource": "prometheus",
    "__rate_interval": "1m",
    "__range": "5m",
}


def expand_grafana(expr: str, values: dict[str, str]) -> str:
    """Substitute Grafana variables ($name, ${name}) the way a dashboard would at query time."""
    expanded = re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], expr)
    return re.sub(r"\$(__\w+|\w+)", lambda m: values[m.group(1)], expanded)


def rule_expressions() -> list[tuple[str, str]]:
    """(rule name, expression) for every recording and alerting rule."""
    out = []
    for path in sorted(RULES_DIR.glob("*.yaml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                out.append((rule.get("record") or rule["alert"], rule["expr"]))
    return out


def dashboard_expressions() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, expression) for every panel target."""
    out = []
    for path in sorted(DASHBOARD_DIR.glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel["targets"]:
                out.append((path.name, panel["title"], target["expr"]))
    return out
