"""Grafana dashboards for dflash-serve, generated so every panel has a unit and a description.

    make generate      # rewrites ops/grafana/dashboards/*.json with the other generated files

The committed JSON is what Grafana (and the chart's ConfigMaps) load; a test regenerates it and
requires it unchanged, and the Prometheus end-to-end test runs every query against a real
Prometheus scraping a real vLLM CPU engine and sidecar.
"""

from __future__ import annotations

import json
from typing import Any

from dflash_sidecar.vllm_metrics import (
    ACCEPTED,
    ACCEPTED_PER_POS,
    DRAFT_TOKENS,
    DRAFTS,
    GENERATION_TOKENS,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    draft_acceptance_rate,
    mean_acceptance_length,
    position_acceptance,
    positions_below,
    ratio,
    sample_name,
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


def speculative_decoding() -> dict[str, Any]:
    b = Board()

    def rate(metric: str, by: str = "", sel: str = SEL) -> str:
        group = f" by ({by})" if by else ""
        return f"sum{group} (rate({metric}{{{sel}}}[{R}]))"

    drafts = rate(sample_name(DRAFTS))
    accepted = rate(sample_name(ACCEPTED))
    draft_tokens = rate(sample_name(DRAFT_TOKENS))
    b.panel(
        "Mean acceptance length",
        "1 + accepted / drafts: tokens emitted per target forward pass. DFlash2 at block 8 "
        "reached about 4 on A100; 1 means the draft is never accepted.",
        "none",
        [
            (mean_acceptance_length(accepted, drafts), "all pods"),
            (
                mean_acceptance_length(
                    rate(sample_name(ACCEPTED), "pod"),
                    rate(sample_name(DRAFTS), "pod"),
                ),
                "{{pod}}",
            ),
        ],
        defaults={"min": 1, "mappings": NO_TRAFFIC},
    )
    b.panel(
        "Drafted-token acceptance rate",
        "accepted / draft tokens: the share of proposed tokens the target keeps.",
        "percentunit",
        [(draft_acceptance_rate(accepted, draft_tokens), "acceptance rate")],
        defaults={"min": 0, "max": 1, "mappings": NO_TRAFFIC},
    )
    per_pos_range = position_acceptance(
        f"sum by (position) (increase({sample_name(ACCEPTED_PER_POS)}{{{SEL}}}[$__range]))",
        f"sum(increase({sample_name(DRAFTS)}{{{SEL}}}[$__range]))",
    )
    b.panel(
        "Per-position acceptance (curve)",
        "accepted at position i / drafts over the whole selected time range, one bar per "
        "position. A healthy draft decays smoothly with position; a cliff at position 0 means "
        "wrong target features.",
        "percentunit",
        [(per_pos_range, "")],
        kind="barchart",
        # A bar chart needs one row per position: an instant query returned as a table.
        target_options={"instant": True, "range": False, "format": "table"},
        options={"xField": "position", "orientation": "vertical", "showValue": "auto"},
        defaults={"min": 0, "max": 1},
    )
    per_pos = position_acceptance(rate(sample_name(ACCEPTED_PER_POS), "position"), drafts)
    b.panel(
        "Per-position acceptance over time (heatmap)",
        "The same ratio per draft position over time: rows are positions, colour is acceptance.",
        "percentunit",
        [(per_pos, "{{position}}")],
        kind="heatmap",
        options={"calculate": False, "yAxis": {"unit": "none"}, "color": {"scheme": "Viridis"}},
    )
    b.panel(
        "Acceptance length a smaller k would give",
        "Predicted from the per-position acceptance of the running draft: 1 + the accepted "
        "tokens at the first k positions per draft. A line at or above the running k shows the "
        "measured mean acceptance length (there are no further positions). If a smaller k "
        "keeps most of it, it costs fewer KV blocks per request: see the docs, Choosing k.",
        "none",
        [
            (
                mean_acceptance_length(
                    rate(sample_name(ACCEPTED_PER_POS), sel=f"{SEL}, {positions_below(k)}"),
                    drafts,
                ),
                f"k={k}",
            )
            for k in range(1, 8)
        ],
        defaults={"min": 1, "mappings": NO_TRAFFIC},
    )
    b.panel(
        "Accepted vs rejected draft tokens",
        "Draft tokens per second the target accepted, and those it rejected (draft tokens minus "
        "accepted): the wasted draft work.",
        TOKENS_PER_S,
        [(accepted, "accepted"), (f"{draft_tokens} - {accepted}", "rejected")],
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
        "k in effect vs running requests",
        "Draft tokens per draft (the k the engine drafts at) beside the requests running: with "
        "a k schedule (speculative.schedule) k falls as the batch grows; with one k it stays "
        "at speculative.numSpeculativeTokens. The sidecar judges acceptance by this k.",
        "none",
        [
            (
                f"{rate(sample_name(DRAFT_TOKENS), 'pod')} "
                f"/ ({rate(sample_name(DRAFTS), 'pod')} > 0)",
                "k {{pod}}",
            ),
            (f"sum by (pod) ({REQUESTS_RUNNING}{{{SEL}}})", "running {{pod}}"),
        ],
        defaults={"min": 0},
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
    b.panel(
        "Mean acceptance length per engine",
        "Per data-parallel engine (vLLM's `engine` label): one engine with a collapsed draft "
        "hides in the average of many.",
        "none",
        [
            (
                mean_acceptance_length(
                    rate(sample_name(ACCEPTED), "pod, engine"),
                    rate(sample_name(DRAFTS), "pod, engine"),
                ),
                "{{pod}} engine {{engine}}",
            )
        ],
        defaults={"min": 1, "mappings": NO_TRAFFIC},
    )

    def per_request(sel: str) -> str:
        return ratio(
            f"sum(rate({sample_name(GENERATION_TOKENS)}{{{sel}}}[{R}]))",
            f"sum(avg_over_time({REQUESTS_RUNNING}{{{sel}}}[{R}]))",
        )

    b.panel(
        "Speculative vs baseline: tokens per second per running request",
        "Decode speed each running request sees, for this release and for the baseline release "
        "picked in the variable (for example the MTP-3 deployment).",
        TOKENS_PER_S,
        [
            (per_request(SEL), "$release"),
            (per_request(BASE_SEL), "baseline $baseline"),
        ],
        defaults={"mappings": NO_TRAFFIC},
    )
    b.panel(
        "Speculative vs baseline: mean acceptance length",
        "Mean acceptance length of this release and of the baseline release.",
        "none",
        [
            (mean_acceptance_length(accepted, drafts), "$release"),
            (
                mean_acceptance_length(
                    rate(sample_name(ACCEPTED), sel=BASE_SEL),
                    rate(sample_name(DRAFTS), sel=BASE_SEL),
                ),
                "baseline $baseline",
            ),
        ],
        defaults={"mappings": NO_TRAFFIC},
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
        "Inter-token latency (per engine step)",
        "vLLM observes this once per engine step, and with speculative decoding a step emits up "
        "to k + 1 tokens: it is the time between steps, not between tokens. See time per "
        "output token for the per-token figure.",
        "s",
        quantiles("vllm:inter_token_latency_seconds"),
    )
    b.panel(
        "Time per output token (per request)",
        "Per request: (end-to-end latency - time to first token) / (output tokens - 1), the "
        "per-token decode time a client sees, speculation included.",
        "s",
        quantiles("vllm:request_time_per_output_token_seconds"),
    )
    b.panel(
        "End-to-end request latency",
        "Time from request arrival to the last token.",
        "s",
        quantiles("vllm:e2e_request_latency_seconds"),
    )
    b.panel(
        "Token throughput",
        "Prompt tokens prefilled and output tokens generated per second. When idle, the "
        "sidecar's one-token canary (at most every 15 s, sidecar.canaryInterval) shows as a "
        "trickle.",
        TOKENS_PER_S,
        [
            (f"sum(rate(vllm:prompt_tokens_total{{{SEL}}}[{R}]))", "prompt"),
            (f"sum(rate({sample_name(GENERATION_TOKENS)}{{{SEL}}}[{R}]))", "generation"),
        ],
    )
    b.panel(
        "Output tokens per engine",
        "Generated tokens per second per data-parallel engine (vLLM's `engine` label).",
        TOKENS_PER_S,
        [
            (
                f"sum by (pod, engine) (rate({sample_name(GENERATION_TOKENS)}{{{SEL}}}[{R}]))",
                "{{pod}} engine {{engine}}",
            )
        ],
    )
    b.panel(
        "Requests running and waiting",
        "Requests in the running batch and in the queue.",
        "short",
        [
            (f"sum({REQUESTS_RUNNING}{{{SEL}}})", "running"),
            (f"sum({REQUESTS_WAITING}{{{SEL}}})", "waiting"),
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
        "Prefix-cache hit rate",
        "Cached prompt tokens / queried prompt tokens: how much prefill the prefix cache saves.",
        "percentunit",
        [
            (
                ratio(
                    f"sum(rate(vllm:prefix_cache_hits_total{{{SEL}}}[{R}]))",
                    f"sum(rate(vllm:prefix_cache_queries_total{{{SEL}}}[{R}]))",
                ),
                "hit rate",
            )
        ],
        defaults={"min": 0, "max": 1, "mappings": NO_TRAFFIC},
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
        "Engine state (sidecar)",
        "What the sidecar sees: starting (loading, within the startup budget), serving, "
        "not generating (/health answers, no tokens), down (served before, /health fails "
        "now), start timeout.",
        "none",
        [
            (
                f"max by (pod, state) (dflash_engine_state{{{POD_SEL}}} == 1)",
                "{{state}}",
            )
        ],
        kind="state-timeline",
        defaults={
            "mappings": [
                {"type": "value", "options": {"1": {"text": "active"}}},
            ]
        },
    )
    b.panel(
        "Engine readiness (sidecar)",
        "1 when the sidecar finds the engine healthy and generating; 0 otherwise (see /readyz).",
        "none",
        [(f"min by (pod) (dflash_engine_ready{{{POD_SEL}}})", "{{pod}}")],
        kind="state-timeline",
        defaults={"mappings": two_states("not ready", "ready")},
    )
    router_panels(b)
    return b.dashboard(
        "dflash-serving",
        "dflash-serve / Serving",
        "Latency, throughput, queue and KV cache of the vLLM engines served by dflash-serve.",
        baseline=False,
    )


# The router's series carry the release (the chart's PodMonitor) and a `worker` per replica.
ROUTER_SEL = 'namespace=~"$namespace", release=~"$release"'


def router_panels(b: Board) -> None:
    """vLLM's router (router.enabled, or `local up --replicas N`); empty without one."""
    b.panel(
        "Requests per replica (router)",
        "Requests the router sent to each engine replica. With cache_aware one replica may get "
        "more: requests go where their prefix is cached unless the loads differ by more than "
        "router.cacheAware.balance*Threshold.",
        "reqps",
        [
            (
                "sum by (worker) (rate(vllm_router_processed_requests_total"
                f"{{{ROUTER_SEL}}}[{R}]))",
                "{{worker}}",
            )
        ],
    )
    b.panel(
        "Prefix routing decisions (router)",
        "cache_aware's decisions: prefix_hit sent the request to the replica whose tree held "
        "the longest match; prefix_miss to the least loaded; missing_tokens routed without "
        "knowing the prompt's tokens (the engines refuse the render endpoints: they need "
        "--enable-scale-out, which the chart sets for cache_aware).",
        "reqps",
        [
            (
                "sum by (outcome) (rate(vllm_router_prefix_routing_decisions_total"
                f"{{{ROUTER_SEL}}}[{R}]))",
                "{{outcome}}",
            )
        ],
    )
    b.panel(
        "Replica health (router)",
        "Per replica: healthy when its /health checks pass and its circuit is closed; ejected "
        "(no requests) after failed health checks or failed requests (DFlashRouterWorkerEjected "
        "warns when that lasts 2 minutes while others serve).",
        "none",
        [
            (
                f"min by (worker) (vllm_router_worker_health{{{ROUTER_SEL}}}) * "
                f"on (worker) group_left () (1 - clamp_max(max by (worker) "
                f"(vllm_router_cb_state{{{ROUTER_SEL}}}), 1))",
                "{{worker}}",
            )
        ],
        kind="state-timeline",
        defaults={"mappings": two_states("ejected", "healthy")},
    )
    b.panel(
        "Requests in flight per replica (router)",
        "Requests the router has sent to each replica and not yet seen finish: the load the "
        "cache_aware balance thresholds compare (the router exports no queue depth of its own; "
        "the engines' queues are in the panels above).",
        "none",
        [
            (
                f"sum by (worker) (vllm_router_running_requests{{{ROUTER_SEL}}})",
                "{{worker}}",
            )
        ],
    )


DASHBOARDS = {
    "speculative-decoding.json": speculative_decoding,
    "serving.json": serving,
}


def render() -> dict[str, str]:
    return {name: json.dumps(build(), indent=2) + "\n" for name, build in DASHBOARDS.items()}
