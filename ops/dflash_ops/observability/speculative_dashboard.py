"""The speculative-decoding dashboard: acceptance from vLLM's spec_decode counters and the
sidecar's verdict."""

from __future__ import annotations

from typing import Any

from dflash_sidecar.recommendation import STEP_COST_DRIFT
from dflash_sidecar.vllm_metrics import (
    ACCEPTED,
    ACCEPTED_PER_POS,
    DRAFT_TOKENS,
    DRAFTS,
    GENERATION_TOKENS,
    REQUESTS_RUNNING,
    draft_acceptance_rate,
    mean_acceptance_length,
    position_acceptance,
    positions_below,
    ratio,
    sample_name,
)

from dflash_ops.observability.board import (
    BASE_SEL,
    NO_TRAFFIC,
    POD_SEL,
    SEL,
    TOKENS_PER_S,
    Board,
    R,
)


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
    schedule_panels(b)
    return b.dashboard(
        "dflash-speculative",
        "dflash-serve / Speculative decoding",
        "Acceptance of the DFlash2 (or MTP) draft from vLLM's spec_decode counters and the "
        "dflash-serve sidecar.",
        baseline=True,
    )


def schedule_panels(b: Board) -> None:
    """The sidecar's schedule recommendation (GET /recommendation): what it predicts for the
    running schedule and for the one the traffic asks for, the gain, and the k per range."""
    predicted = "dflash_schedule_predicted_tokens_per_second"
    b.panel(
        "k schedule: running against recommended (predicted)",
        "Output tokens/s the sidecar predicts for the running k schedule and for the one its "
        "longest window's traffic asks for, from the step cost the sweep fitted and the live "
        "acceptance and running batch. Empty until the sidecar has a step-cost baseline and "
        "enough traffic: GET /recommendation says why.",
        TOKENS_PER_S,
        [
            (f'max by (pod) ({predicted}{{{POD_SEL}, schedule="running"}})', "running {{pod}}"),
            (
                f'max by (pod) ({predicted}{{{POD_SEL}, schedule="recommended"}})',
                "recommended {{pod}}",
            ),
        ],
        width=8,
    )
    b.panel(
        "k schedule: predicted gain",
        "The recommended schedule over the running one, minus 1. Above 5% the sidecar "
        "recommends a change; above 10% for 3 h DFlashScheduleGainAvailable fires. Verify with "
        "bench sweep --schedule before rolling it out.",
        "percentunit",
        [(f"max by (pod) (dflash_schedule_predicted_gain{{{POD_SEL}}})", "{{pod}}")],
        width=8,
        defaults={
            "thresholds": {
                "mode": "absolute",
                "steps": [{"color": "green", "value": None}, {"color": "orange", "value": 0.1}],
            }
        },
    )
    b.panel(
        "k schedule: recommended k per running batch",
        "The recommended k for each range of running requests (last 65536: open-ended).",
        "none",
        [
            (
                f"max by (first, last) (dflash_schedule_recommended_k{{{POD_SEL}}})",
                "{{first}}-{{last}} running",
            )
        ],
        width=8,
        defaults={"min": 0},
    )
    b.panel(
        "k schedule: engine over its step cost",
        "The engine's output tokens/s while generating over what the step cost predicts for the "
        "running schedule at the same batch sizes and acceptance. Within 0.75-1.25: the step "
        "cost's own run-to-run variation. Outside (orange), the step cost has drifted (another "
        "machine, day or traffic than its sweep): the predictions above are scaled to the engine; "
        "refit with bench sweep on this traffic.",
        "none",
        [(f"max by (pod) (dflash_schedule_step_cost_ratio{{{POD_SEL}}})", "{{pod}}")],
        width=8,
        defaults={
            "thresholds": {
                "mode": "absolute",
                "steps": [
                    {"color": "orange", "value": None},
                    {"color": "green", "value": 1 - STEP_COST_DRIFT},
                    {"color": "orange", "value": 1 + STEP_COST_DRIFT},
                ],
            }
        },
    )
