"""vLLM's speculative-decoding and throughput metrics, by name, and the acceptance figures the
sidecar computes from them, written once as PromQL for the dashboards and the recording rules.

The sidecar's own arithmetic on the same counters is `acceptance_window.acceptance_ratios`;
tests hold the dashboards and `ops/prometheus/rules` to the expressions built here.
"""

from __future__ import annotations

# Families (the sample of a counter family carries a `_total` suffix).
DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
GENERATION_TOKENS = "vllm:generation_tokens"
REQUESTS_RUNNING = "vllm:num_requests_running"
REQUESTS_WAITING = "vllm:num_requests_waiting"

COUNTERS = frozenset({DRAFTS, DRAFT_TOKENS, ACCEPTED, ACCEPTED_PER_POS, GENERATION_TOKENS})
GAUGES = frozenset({REQUESTS_RUNNING, REQUESTS_WAITING})


def sample_name(family: str) -> str:
    """The name of the family's samples in the text format."""
    return f"{family}_total" if family in COUNTERS else family


def ratio(numerator: str, denominator: str) -> str:
    """numerator / denominator with the denominator, not the ratio, dropped at zero: at total
    collapse the ratio is exactly 1 (or 0) and must stay visible."""
    return f"{numerator} / ({denominator} > 0)"


def mean_acceptance_length(accepted: str, drafts: str) -> str:
    """1 + accepted / drafts: tokens emitted per target forward pass."""
    return f"1 + {ratio(accepted, drafts)}"


def draft_acceptance_rate(accepted: str, draft_tokens: str) -> str:
    """accepted / draft tokens: the share of proposed tokens the target keeps."""
    return ratio(accepted, draft_tokens)


def positions_below(k: int) -> str:
    """The label matcher for draft positions 0..k-1: with mean_acceptance_length over the
    accepted tokens at those positions, the acceptance length a draft of length k would give
    (acceptance_window.acceptance_length_at)."""
    return 'position=~"' + "|".join(str(i) for i in range(k)) + '"'


def position_acceptance(accepted_per_pos: str, drafts: str, match: str = "") -> str:
    """accepted at position i / drafts, one series per position; `match` lists the labels both
    sides are matched on (empty: the drafts side is one series)."""
    return f"{accepted_per_pos} / on ({match}) group_left () ({drafts} > 0)"
