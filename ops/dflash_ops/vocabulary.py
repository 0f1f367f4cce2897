"""The project's words for what a user chooses, each written once: the speculative methods (all of
them, and the subsets the chart and the local stack serve), the largest k, and vLLM's router
policies (all of them, and the ones the chart and the local stack start the router with).

Everything else takes them from here: the CLI's choices, the typed configs, the sweep, and the
chart (`make generate` writes them into values.schema.json's enums and files/vocabulary.yaml,
which the chart's own checks read)."""

from __future__ import annotations

from typing import Literal, TypeVar, get_args

# dflash: a DFlash/DFlash2 draft; draft_model: any small draft model (the local CPU stack's
# stand-in for DFlash2); mtp: the checkpoint's own MTP head; ngram: prompt lookup; off: no
# speculation.
SpeculativeMethod = Literal["dflash", "draft_model", "mtp", "ngram", "off"]
# What the chart serves on GPUs and the planner plans.
ChartMethod = Literal["dflash", "mtp", "ngram", "off"]
# What the local stack's vLLM CPU engine serves.
LocalMethod = Literal["draft_model", "ngram", "off"]

SPECULATIVE_METHODS: tuple[SpeculativeMethod, ...] = get_args(SpeculativeMethod)
CHART_METHODS: tuple[ChartMethod, ...] = get_args(ChartMethod)
LOCAL_METHODS: tuple[LocalMethod, ...] = get_args(LocalMethod)

# The local stack's model pairs, built on the fly: tiny (float32, starts fastest; its draft is
# the target plus noise, as costly as the target) and paying (a ~180M bfloat16 target with a
# draft of its first layers: speculation pays at low load on a CPU, as it does on a GPU).
LocalModels = Literal["tiny", "paying"]
LOCAL_MODELS: tuple[LocalModels, ...] = get_args(LocalModels)

# The largest num_speculative_tokens planned, rendered and served: a DFlash2 block of 16.
MAX_K = 15

# A path of the door's allow-list (door.keyedPaths): segments of URL-safe characters, or {name}
# for any one segment. The chart's schema and its own check read it from here (make generate).
DOOR_PATH_PATTERN = r"^(/([A-Za-z0-9_~-][A-Za-z0-9._~-]*|\{[A-Za-z_][A-Za-z0-9_]*\}))+$"

# vllm-router 0.1.17's --policy values for plain HTTP workers. kv_aware also reads the engines'
# KV-cache events (ZMQ), which `bench router-policies` turns on and the chart does not.
RouterPolicy = Literal[
    "cache_aware", "kv_aware", "round_robin", "consistent_hash", "power_of_two", "random"
]
# What the chart and the local stack start the router with: the policies that need nothing
# beyond the workers' URLs.
StandingRouterPolicy = Literal[
    "cache_aware", "round_robin", "consistent_hash", "power_of_two", "random"
]

ROUTER_POLICIES: tuple[RouterPolicy, ...] = get_args(RouterPolicy)
STANDING_ROUTER_POLICIES: tuple[StandingRouterPolicy, ...] = get_args(StandingRouterPolicy)

Word = TypeVar("Word", bound=str)


def speculating(methods: tuple[Word, ...]) -> tuple[Word, ...]:
    """The methods of `methods` that speculate (all but off)."""
    return tuple(m for m in methods if m != "off")


def chart_vocabulary() -> dict[str, object]:
    """What the chart's templates read (files/vocabulary.yaml; the largest k is in
    files/block-sizes.yaml, beside the block sizes it bounds)."""
    from dflash_ops.speculative_schedule import OPEN_END

    return {
        "speculativeMethods": list(CHART_METHODS),
        "scheduleOpenEnd": OPEN_END,
        "doorPathPattern": DOOR_PATH_PATTERN,
    }
