"""The engine's `--speculative-config` for each method: one builder for the planner, the local
stack and the GPU check run; the chart's Go helper is tested against it for every method
and k (tests/charts/test_speculative_config.py)."""

from __future__ import annotations

import json

from dflash_ops.speculative_schedule import Schedule
from dflash_ops.vocabulary import SpeculativeMethod

# The n-gram proposer's lookup window (prompt tokens matched to propose a continuation).
NGRAM_PROMPT_LOOKUP_MAX = 4
NGRAM_PROMPT_LOOKUP_MIN = 2


def speculative_config(
    method: SpeculativeMethod,
    k: int,
    draft_model: str | None = None,
    schedule: Schedule | None = None,
) -> dict[str, object] | None:
    """The config for `method` at k speculative tokens (with a k-by-batch-size `schedule`, k is
    the largest it drafts), or None when speculation is off."""
    if method == "off" or k == 0:
        if schedule is not None:
            raise ValueError("a k schedule needs speculative decoding on")
        return None
    spec: dict[str, object] = {"method": method, "num_speculative_tokens": k}
    if method in ("dflash", "draft_model"):
        if not draft_model:
            raise ValueError(f"speculative method {method} needs a draft model")
        spec["model"] = draft_model
    elif method == "ngram":
        spec["prompt_lookup_max"] = NGRAM_PROMPT_LOOKUP_MAX
        spec["prompt_lookup_min"] = NGRAM_PROMPT_LOOKUP_MIN
    elif method != "mtp":
        raise ValueError(f"unknown speculative method {method!r}")
    if schedule is not None:
        spec["num_speculative_tokens_per_batch_size"] = [list(entry) for entry in schedule]
    return spec


def speculative_config_args(
    method: SpeculativeMethod,
    k: int,
    draft_model: str | None = None,
    schedule: Schedule | None = None,
) -> list[str]:
    """`--speculative-config JSON`, or nothing when speculation is off."""
    spec = speculative_config(method, k, draft_model, schedule)
    return [] if spec is None else ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
