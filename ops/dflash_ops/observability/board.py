"""What every dflash-serve dashboard is built with: the template variables, the selectors every
query shares and `Board`, which lays panels out and gives each a unit and a description."""

from __future__ import annotations

from typing import Any

from dflash_sidecar.vllm_metrics import (
    REQUESTS_RUNNING,
)

SEL = (
    'namespace=~"$namespace", release=~"$release", pod=~"$pod", model_name=~"$model", '
    'engine=~"$engine"'
)
BASE_SEL = 'namespace=~"$namespace", release=~"$baseline", model_name=~"$model"'
POD_SEL = 'namespace=~"$namespace", release=~"$release", pod=~"$pod"'
R = "$__rate_interval"
RUNNING_IN_RELEASE = f'{REQUESTS_RUNNING}{{namespace=~"$namespace", release=~"$release"}}'
# Grafana unit for token rates (a custom suffix unit: Grafana has no tokens/s unit id).
TOKENS_PER_S = "suffix: tok/s"
# Ratios show why they are empty: NaN (0/0) means no traffic, a missing series no data.
NO_TRAFFIC = [
    {"type": "special", "options": {"match": "nan", "result": {"text": "no traffic"}}},
    {"type": "special", "options": {"match": "null", "result": {"text": "no data"}}},
]


def _variables(baseline: bool) -> list[dict[str, Any]]:
    def query_var(name: str, label: str, query: str, include_all: bool = True) -> dict[str, Any]:
        return {
            "name": name,
            "label": label,
            "type": "query",
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "query": {"query": query, "refId": f"{name}-var"},
            "definition": query,
            "refresh": 2,
            "includeAll": include_all,
            "multi": include_all,
            "allValue": ".*",
            "current": {"text": "All", "value": "$__all"} if include_all else {},
            "sort": 1,
        }

    variables = [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
        },
        query_var("namespace", "Namespace", f"label_values({REQUESTS_RUNNING}, namespace)"),
        query_var(
            "release",
            "Release",
            f'label_values({REQUESTS_RUNNING}{{namespace=~"$namespace"}}, release)',
        ),
        query_var(
            "pod",
            "Pod",
            f"label_values({RUNNING_IN_RELEASE}, pod)",
        ),
        query_var(
            "model",
            "Model",
            f"label_values({RUNNING_IN_RELEASE}, model_name)",
        ),
        # Data-parallel deployments run several engines per pod (vLLM's `engine` label).
        query_var(
            "engine",
            "Engine (data-parallel rank)",
            f"label_values({RUNNING_IN_RELEASE}, engine)",
        ),
    ]
    if baseline:
        variables.append(
            query_var(
                "baseline",
                "Baseline release",
                f'label_values({REQUESTS_RUNNING}{{namespace=~"$namespace"}}, release)',
                include_all=False,
            )
        )
    return variables


def two_states(off: str, on: str) -> list[dict[str, Any]]:
    """Value mappings of a 0/1 state timeline: 0 red, 1 green."""
    return [
        {
            "type": "value",
            "options": {
                "0": {"text": off, "color": "red"},
                "1": {"text": on, "color": "green"},
            },
        }
    ]


class Board:
    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self._y = 0
        self._x = 0

    def panel(
        self,
        title: str,
        description: str,
        unit: str,
        targets: list[tuple[str, str]],
        kind: str = "timeseries",
        width: int = 12,
        height: int = 8,
        target_options: dict[str, Any] | None = None,
        **extra: Any,
    ) -> None:
        if self._x + width > 24:
            self._x, self._y = 0, self._y + height
        panel: dict[str, Any] = {
            "id": len(self.panels) + 1,
            "type": kind,
            "title": title,
            "description": description,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"x": self._x, "y": self._y, "w": width, "h": height},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": {},
            "targets": [
                {
                    "refId": chr(ord("A") + i),
                    "expr": expr,
                    "legendFormat": legend,
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    **(target_options or {}),
                }
                for i, (expr, legend) in enumerate(targets)
            ],
        }
        for key, value in extra.items():
            if key == "defaults":
                panel["fieldConfig"]["defaults"].update(value)
            else:
                panel[key] = value
        self.panels.append(panel)
        self._x += width

    def dashboard(self, uid: str, title: str, description: str, baseline: bool) -> dict[str, Any]:
        return {
            "uid": uid,
            "title": title,
            "description": description,
            "tags": ["dflash-serve", "vllm"],
            "timezone": "browser",
            "schemaVersion": 39,
            "version": 1,
            "editable": True,
            "refresh": "30s",
            "time": {"from": "now-1h", "to": "now"},
            "templating": {"list": _variables(baseline)},
            "annotations": {"list": []},
            "panels": self.panels,
        }
