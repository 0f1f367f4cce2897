"""Turn the chart's rendered PodMonitor and PrometheusRule into what the Prometheus Operator
would give Prometheus, so a real Prometheus here scrapes and evaluates exactly that.

Encoded from prometheus-operator `pkg/prometheus/promcfg.go` (generatePodMonitorConfig): the job
is `podMonitor/<ns>/<name>/<i>`; the relabelings keep pods whose labels match the selector and
containers whose port name is the endpoint's `port`, set `namespace`, `container`, `pod`,
`job=<ns>/<name>` and `endpoint=<port>`, then apply the endpoint's own `relabelings`. Kubernetes
service discovery is replaced by static targets that carry the same `__meta_kubernetes_*` labels
for the local pod (one target per container port), so every relabeling really runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


def sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


@dataclass
class LocalPod:
    namespace: str
    name: str
    labels: dict[str, str]
    ports: dict[str, tuple[str, int]]  # port name -> (container name, local port)

    def targets(self) -> list[dict[str, Any]]:
        meta = {
            "__meta_kubernetes_namespace": self.namespace,
            "__meta_kubernetes_pod_name": self.name,
            "__meta_kubernetes_pod_phase": "Running",
        }
        for key, value in self.labels.items():
            meta[f"__meta_kubernetes_pod_label_{sanitize(key)}"] = value
            meta[f"__meta_kubernetes_pod_labelpresent_{sanitize(key)}"] = "true"
        return [
            {
                "targets": [f"127.0.0.1:{port}"],
                "labels": meta
                | {
                    "__meta_kubernetes_pod_container_name": container,
                    "__meta_kubernetes_pod_container_port_name": port_name,
                    "__meta_kubernetes_pod_container_port_number": str(port),
                },
            }
            for port_name, (container, port) in self.ports.items()
        ]


def _relabel(rule: dict[str, Any]) -> dict[str, Any]:
    """A monitoring.coreos.com RelabelConfig in Prometheus' own spelling."""
    names = {
        "sourceLabels": "source_labels",
        "targetLabel": "target_label",
        "separator": "separator",
        "regex": "regex",
        "replacement": "replacement",
        "action": "action",
        "modulus": "modulus",
    }
    return {names[k]: v for k, v in rule.items()}


def scrape_configs(podmonitor: dict[str, Any], pod: LocalPod) -> list[dict[str, Any]]:
    meta, spec = podmonitor["metadata"], podmonitor["spec"]
    configs = []
    for i, endpoint in enumerate(spec["podMetricsEndpoints"]):
        relabel: list[dict[str, Any]] = [
            {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
            {
                "action": "drop",
                "source_labels": ["__meta_kubernetes_pod_phase"],
                "regex": "(Failed|Succeeded)",
            },
        ]
        for key in sorted(spec["selector"].get("matchLabels", {})):
            relabel.append(
                {
                    "action": "keep",
                    "source_labels": [
                        f"__meta_kubernetes_pod_label_{sanitize(key)}",
                        f"__meta_kubernetes_pod_labelpresent_{sanitize(key)}",
                    ],
                    "regex": f"({spec['selector']['matchLabels'][key]});true",
                }
            )
        relabel += [
            {
                "action": "keep",
                "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "regex": endpoint["port"],
            },
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {
                "source_labels": ["__meta_kubernetes_pod_container_name"],
                "target_label": "container",
            },
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"},
            {"target_label": "endpoint", "replacement": endpoint["port"]},
        ]
        relabel += [_relabel(r) for r in endpoint.get("relabelings", [])]
        configs.append(
            {
                "job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/{i}",
                "honor_labels": False,
                "metrics_path": endpoint.get("path", "/metrics"),
                "scrape_interval": endpoint.get("interval", "30s"),
                "static_configs": pod.targets(),
                "relabel_configs": relabel,
            }
        )
    return configs


def rule_file(prometheusrule: dict[str, Any]) -> dict[str, Any]:
    """The operator writes each PrometheusRule's spec as one rule file."""
    return {"groups": prometheusrule["spec"]["groups"]}
