"""The serving dashboard: latency, throughput, the queue, the KV cache and the router."""

from __future__ import annotations

from typing import Any

from dflash_sidecar.vllm_metrics import (
    GENERATION_TOKENS,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    ratio,
    sample_name,
)

from dflash_ops.observability.board import (
    NO_TRAFFIC,
    POD_SEL,
    SEL,
    TOKENS_PER_S,
    Board,
    R,
    two_states,
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
