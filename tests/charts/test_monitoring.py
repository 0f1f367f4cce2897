from __future__ import annotations

import json

import yaml
from dflash_ops.promql_names import DASHBOARD_DIR, RULES_DIR

from tests.charts.conftest import Manifests, one, render


def test_podmonitor_labels_are_configurable_and_relabel_release_and_role() -> None:
    monitor = one(
        render("monitoring.podMonitor.labels.release=kube-prometheus-stack"), "PodMonitor"
    )
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    assert [e["port"] for e in endpoints] == ["http", "sidecar"]
    targets = {r["targetLabel"] for r in endpoints[0]["relabelings"]}
    assert targets == {"release", "role"}


def test_prometheusrule_is_the_ops_rules_file(default: Manifests) -> None:
    rule = one(default, "PrometheusRule")
    source = yaml.safe_load((RULES_DIR / "dflash-serve.rules.yaml").read_text())
    assert rule["spec"]["groups"] == source["groups"]


def test_dashboards_are_the_ops_files(default: Manifests) -> None:
    maps = [m for (k, _), m in default.items() if k == "ConfigMap"]
    data = {name: json.loads(text) for m in maps for name, text in m["data"].items()}
    for path in DASHBOARD_DIR.glob("*.json"):
        assert data[path.name] == json.loads(path.read_text())
    assert all(m["metadata"]["labels"]["grafana_dashboard"] == "1" for m in maps)


def test_monitoring_can_be_switched_off() -> None:
    manifests = render(
        "monitoring.podMonitor.enabled=false",
        "monitoring.prometheusRule.enabled=false",
        "monitoring.grafanaDashboards.enabled=false",
    )
    kinds = {k for k, _ in manifests}
    assert not kinds & {"PodMonitor", "PrometheusRule", "ConfigMap"}
