from __future__ import annotations

import json

import yaml
from dflash_ops.paths import PROFILES_DIR as PROFILES

from tests.charts.conftest import Manifests, one, render
from tests.ops.observability.promql_names import DASHBOARD_DIR, RULES_DIR


def test_one_labels_value_reaches_the_podmonitor_and_the_prometheusrule() -> None:
    manifests = render("monitoring.labels.release=kube-prometheus-stack")
    monitor = one(manifests, "PodMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rule = one(manifests, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    assert [e["port"] for e in endpoints] == ["http", "sidecar"]
    targets = {r["targetLabel"] for r in endpoints[0]["relabelings"]}
    assert targets == {"release", "role"}


def test_prometheusrule_is_the_ops_rules_file_scoped_to_the_release(default: Manifests) -> None:
    rule = one(default, "PrometheusRule")
    source = (RULES_DIR / "dflash-serve.rules.yaml").read_text()
    scoped = yaml.safe_load(source.replace('release=~".+"', 'namespace="llm", release="t"'))
    assert rule["spec"]["groups"] == scoped["groups"]


def dashboards(manifests: Manifests) -> dict[str, dict]:  # type: ignore[type-arg]
    # Grafana's dashboard sidecar loads every ConfigMap carrying this label, and
    # only those: the model-download script's ConfigMap must not carry it.
    maps = [
        m
        for (k, _), m in manifests.items()
        if k == "ConfigMap" and m["metadata"].get("labels", {}).get("grafana_dashboard") == "1"
    ]
    assert maps
    return {name: json.loads(text) for m in maps for name, text in m["data"].items()}


def test_dashboards_are_the_ops_files_opened_on_this_release(default: Manifests) -> None:
    data = dashboards(default)
    for path in DASHBOARD_DIR.glob("*.json"):
        source, rendered = json.loads(path.read_text()), data[path.name]
        assert rendered["panels"] == source["panels"]
        assert rendered["uid"].startswith(source["uid"]) and len(rendered["uid"]) <= 40
        assert rendered["title"] == f"{source['title']} (llm/t)"
        release = next(v for v in rendered["templating"]["list"] if v["name"] == "release")
        assert release["current"] == {"text": "t", "value": "t"}


def test_two_releases_side_by_side_do_not_share_dashboard_uids() -> None:
    speculative = dashboards(render())
    baseline = dashboards(render(values=[PROFILES / "a100-tp2-mtp3.yaml"], release="base"))
    for name in speculative:
        assert speculative[name]["uid"] != baseline[name]["uid"]


def test_monitoring_can_be_switched_off() -> None:
    manifests = render(
        "monitoring.podMonitor.enabled=false",
        "monitoring.prometheusRule.enabled=false",
        "monitoring.grafanaDashboards.enabled=false",
    )
    kinds = {k for k, _ in manifests}
    assert not kinds & {"PodMonitor", "PrometheusRule"}
    assert not [
        m
        for (k, _), m in manifests.items()
        if k == "ConfigMap" and "grafana_dashboard" in m["metadata"].get("labels", {})
    ]
