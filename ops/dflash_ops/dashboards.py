"""Grafana dashboards for dflash-serve, generated so every panel has a unit and a description.

    python -m dflash_ops.dashboards          # rewrite ops/grafana/dashboards/*.json

The committed JSON is what Grafana (and the chart's ConfigMaps) load; a test regenerates it and
requires it unchanged, and the Prometheus end-to-end test runs every query against a real
Prometheus scraping a real vLLM CPU engine and sidecar.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DASHBOARD_DIR = Path(__file__).resolve().parents[1] / "grafana" / "dashboards"
SEL = 'namespace=~"$namespace", release=~"$release", pod=~"$pod", model_name=~"$model"'
BASE_SEL = 'namespace=~"$namespace", release=~"$baseline", model_name=~"$model"'
POD_SEL = 'namespace=~"$namespace", release=~"$release", pod=~"$pod"'
R = "$__rate_interval"
RUNNING_IN_RELEASE = 'vllm:num_requests_running{namespace=~"$namespace", release=~"$release"}'


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
        query_var("namespace", "Namespace", "label_values(vllm:num_requests_running, namespace)"),
        query_var(
            "release",
            "Release",
            'label_values(vllm:num_requests_running{namespace=~"$namespace"}, release)',
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
    ]
    if baseline:
        variables.append(
            query_var(
                "baseline",
                "Baseline release",
                'label_values(vllm:num_requests_running{namespace=~"$namespace"}, release)',
                include_all=False,
            )
        )
    return variables


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


def speculative_decoding() -> dict[str, Any]:
    b = Board()
    drafts = f"sum(rate(vllm:spec_decode_num_drafts_total{{{SEL}}}[{R}]))"
    accepted = f"sum(rate(vllm:spec_decode_num_accepted_tokens_total{{{SEL}}}[{R}]))"
    b.panel(
        "Mean acceptance length",
        "1 + accepted / drafts: tokens emitted per target forward pass. DFlash2 at block 8 "
        "reached about 4 on A100; 1 means the draft is never accepted.",
        "none",
        [
            (f"1 + {accepted} / {drafts}", "all pods"),
            (
                "1 + sum by (pod) "
                f"(rate(vllm:spec_decode_num_accepted_tokens_total{{{SEL}}}[{R}])) "
                f"/ sum by (pod) (rate(vllm:spec_decode_num_drafts_total{{{SEL}}}[{R}]))",
                "{{pod}}",
            ),
        ],
        defaults={"min": 1},
    )
    b.panel(
        "Drafted-token acceptance rate",
        "accepted / draft tokens: the share of proposed tokens the target keeps.",
        "percentunit",
        [
            (
                f"{accepted} / sum(rate(vllm:spec_decode_num_draft_tokens_total{{{SEL}}}[{R}]))",
                "acceptance rate",
            )
        ],
        defaults={"min": 0, "max": 1},
    )
    per_pos = (
        "sum by (position) "
        f"(rate(vllm:spec_decode_num_accepted_tokens_per_pos_total{{{SEL}}}[{R}])) "
        f"/ scalar({drafts})"
    )
    b.panel(
        "Per-position acceptance (curve)",
        "accepted at position i / drafts, averaged over the selected range. A healthy draft "
        "decays smoothly with position; a cliff at position 0 means wrong target features.",
        "percentunit",
        [(per_pos, "position {{position}}")],
        kind="barchart",
        options={"xField": "position", "orientation": "vertical", "showValue": "auto"},
        defaults={"min": 0, "max": 1},
    )
    b.panel(
        "Per-position acceptance over time (heatmap)",
        "The same ratio per draft position over time: rows are positions, colour is acceptance.",
        "percentunit",
        [(per_pos, "{{position}}")],
        kind="heatmap",
        options={"calculate": False, "yAxis": {"unit": "none"}, "color": {"scheme": "Viridis"}},
    )
    b.panel(
        "Accepted vs rejected draft tokens",
        "Draft tokens per second the target accepted, and those it rejected (draft tokens minus "
        "accepted): the wasted draft work.",
        "tps",
        [
            (accepted, "accepted"),
            (
                f"sum(rate(vllm:spec_decode_num_draft_tokens_total{{{SEL}}}[{R}])) - {accepted}",
                "rejected",
            ),
        ],
        defaults={"custom": {"stacking": {"mode": "normal"}}},
    )
    b.panel(
        "Drafts per second",
        "Speculative draft proposals per second (one per running request per decode step).",
        "ops",
        [(drafts, "drafts/s")],
        width=6,
    )
    b.panel(
        "Sidecar verdict (5m)",
        "The sidecar's verdict on the 5-minute acceptance curve: 0 healthy, 1 degraded, "
        "2 collapsed, -1 no data. Thresholds are sidecar settings.",
        "none",
        [(f'max by (pod) (dflash_acceptance_verdict_code{{{POD_SEL}, window="5m"}})', "{{pod}}")],
        kind="state-timeline",
        width=6,
        defaults={
            "mappings": [
                {
                    "type": "value",
                    "options": {
                        "-1": {"text": "no data", "color": "gray"},
                        "0": {"text": "healthy", "color": "green"},
                        "1": {"text": "degraded", "color": "orange"},
                        "2": {"text": "collapsed", "color": "red"},
                    },
                }
            ]
        },
    )
    per_request = (
        "sum(rate(vllm:generation_tokens_total{{{sel}}}[{r}])) / "
        "sum(avg_over_time(vllm:num_requests_running{{{sel}}}[{r}]))"
    )
    b.panel(
        "Speculative vs baseline: tokens per second per running request",
        "Decode speed each running request sees, for this release and for the baseline release "
        "picked in the variable (for example the MTP-3 deployment).",
        "tps",
        [
            (per_request.format(sel=SEL, r=R), "$release"),
            (per_request.format(sel=BASE_SEL, r=R), "baseline $baseline"),
        ],
    )
    b.panel(
        "Speculative vs baseline: mean acceptance length",
        "Mean acceptance length of this release and of the baseline release.",
        "none",
        [
            (f"1 + {accepted} / {drafts}", "$release"),
            (
                f"1 + sum(rate(vllm:spec_decode_num_accepted_tokens_total{{{BASE_SEL}}}[{R}])) "
                f"/ sum(rate(vllm:spec_decode_num_drafts_total{{{BASE_SEL}}}[{R}]))",
                "baseline $baseline",
            ),
        ],
    )
    return b.dashboard(
        "dflash-speculative",
        "dflash-serve / Speculative decoding",
        "Acceptance of the DFlash2 (or MTP) draft from vLLM's spec_decode counters and the "
        "dflash-serve sidecar.",
        baseline=True,
    )


def serving() -> dict[str, Any]:
    b = Board()

    def quantiles(metric: str) -> list[tuple[str, str]]:
        return [
            (
                f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{{{SEL}}}[{R}])))",
                f"p{int(q * 100)}",
            )
            for q in (0.5, 0.95, 0.99)
        ]

    b.panel(
        "Time to first token",
        "Latency from request arrival to the first output token (queue + prefill).",
        "s",
        quantiles("vllm:time_to_first_token_seconds"),
    )
    b.panel(
        "Inter-token latency",
        "Time between output tokens of a request; speculation lowers it when drafts are accepted.",
        "s",
        quantiles("vllm:inter_token_latency_seconds"),
    )
    b.panel(
        "End-to-end request latency",
        "Time from request arrival to the last token.",
        "s",
        quantiles("vllm:e2e_request_latency_seconds"),
    )
    b.panel(
        "Token throughput",
        "Prompt tokens prefilled and output tokens generated per second.",
        "tps",
        [
            (f"sum(rate(vllm:prompt_tokens_total{{{SEL}}}[{R}]))", "prompt"),
            (f"sum(rate(vllm:generation_tokens_total{{{SEL}}}[{R}]))", "generation"),
        ],
    )
    b.panel(
        "Requests running and waiting",
        "Requests in the running batch and in the queue.",
        "short",
        [
            (f"sum(vllm:num_requests_running{{{SEL}}})", "running"),
            (f"sum(vllm:num_requests_waiting{{{SEL}}})", "waiting"),
        ],
    )
    b.panel(
        "KV-cache use",
        "Share of the KV-cache blocks in use, per pod. Near 100% with a queue means preemption.",
        "percentunit",
        [(f"max by (pod) (vllm:kv_cache_usage_perc{{{SEL}}})", "{{pod}}")],
        defaults={"min": 0, "max": 1},
    )
    b.panel(
        "Preemptions",
        "Requests preempted per second because the KV cache ran out.",
        "ops",
        [(f"sum(rate(vllm:num_preemptions_total{{{SEL}}}[{R}]))", "preemptions/s")],
    )
    b.panel(
        "Finished requests",
        "Requests finished per second, by finish reason.",
        "reqps",
        [
            (
                f"sum by (finished_reason) (rate(vllm:request_success_total{{{SEL}}}[{R}]))",
                "{{finished_reason}}",
            )
        ],
    )
    b.panel(
        "Engine readiness (sidecar)",
        "1 when the sidecar finds the engine healthy and generating; 0 otherwise (see /readyz).",
        "bool",
        [(f"min by (pod) (dflash_engine_ready{{{POD_SEL}}})", "{{pod}}")],
        kind="state-timeline",
    )
    return b.dashboard(
        "dflash-serving",
        "dflash-serve / Serving",
        "Latency, throughput, queue and KV cache of the vLLM engines served by dflash-serve.",
        baseline=False,
    )


DASHBOARDS = {
    "speculative-decoding.json": speculative_decoding,
    "serving.json": serving,
}


def render() -> dict[str, str]:
    return {name: json.dumps(build(), indent=2) + "\n" for name, build in DASHBOARDS.items()}


def main() -> None:
    DASHBOARD_DIR.mkdir(parents=True, exist_ok=True)
    for name, text in render().items():
        (DASHBOARD_DIR / name).write_text(text)
        print(f"wrote {DASHBOARD_DIR / name}", file=sys.stderr)


if __name__ == "__main__":
    main()
