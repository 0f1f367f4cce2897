"""What differs per model the project serves, written once: the chart's `model.profile`, the
planner's `--model`, and the patch series' checks read it.

A profile says which checkpoints it takes (model types), where they run (GPUs, TP sizes), how
they are served (speculative methods, the reasoning and tool-call parsers, vLLM flags only one
model has), the prefix-cache hit grain vLLM 0.33.0 allows, the draft the chart defaults to, and
which patches of the series the model relies on. `make generate` writes the profiles into the
chart (files/model-profiles.yaml) beside each one's block-size table.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from dflash_ops.errors import UserError
from dflash_ops.vocabulary import CHART_METHODS, ChartMethod

ProfileName = Literal["qwen3.8-flash-next", "glm-5.3-flash"]
PROFILE_NAMES: tuple[ProfileName, ...] = get_args(ProfileName)
DEFAULT_PROFILE: ProfileName = "qwen3.8-flash-next"


class ModelProfile(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: ProfileName
    display_name: str
    model_types: tuple[str, ...] = Field(description="config.json model_type values it takes")
    gpus: tuple[str, ...] = Field(description="GPU products vLLM 0.33.0 serves it on")
    gpu_reason: str = Field(description="why the other GPUs are refused; empty when none is")
    methods: tuple[ChartMethod, ...]
    reasoning_parser: str
    tool_call_parser: str
    engram: bool = Field(description="it has a PLE table: --engram-config applies")
    prefix_match_multiple: int = Field(ge=1, description="--prefix-match-unit is a multiple")
    prefix_match_reason: str
    checkpoint: str = Field(description="the chart's model.name for it; empty: none is public")
    draft_model: str = Field(description="its DFlash2 draft; empty: none is public")
    patches: tuple[str, ...] = Field(description="the patches of the series it relies on")
    patches_reason: str
    block_sizes_file: str = Field(description="its block-size table under the chart's files/")


PROFILES: dict[ProfileName, ModelProfile] = {
    "qwen3.8-flash-next": ModelProfile(
        name="qwen3.8-flash-next",
        display_name="Qwen3.8-Flash-Next",
        model_types=("qwen4_exp", "qwen4_exp_text"),
        gpus=("a100", "b200", "h100", "h200"),
        gpu_reason="",
        methods=CHART_METHODS,
        reasoning_parser="qwen3",
        tool_call_parser="qwen3_xml",
        engram=True,
        prefix_match_multiple=4,
        prefix_match_reason="the QSA compress ratio",
        checkpoint="Qwen/Qwen3.8-Flash-Next-AWQ",
        draft_model="incoai/Qwen3.8-Flash-Next-DFlash2",
        patches=("0001", "0002", "0003", "0004"),
        patches_reason=(
            "0001 and 0002 let qwen4_exp feed a DFlash2 draft, 0003 aligns the block size to "
            "its QSA ring, 0004 keeps sub-block prefix hits with the draft loaded"
        ),
        block_sizes_file="block-sizes.yaml",
    ),
    "glm-5.3-flash": ModelProfile(
        name="glm-5.3-flash",
        display_name="GLM-5.3-Flash",
        model_types=("glm5_next", "glm5_next_text"),
        gpus=("b200", "h100", "h200"),
        gpu_reason=(
            "its attention is sparse MLA, and vLLM 0.33.0's sparse MLA backends need SM90 or SM100"
        ),
        # Its MTP head is not planned: every other method.
        methods=tuple(m for m in CHART_METHODS if m != "mtp"),
        # vLLM's GLM-5 recipe: GLM-4.7's parsers (both names map to the glm47_moe parsers).
        reasoning_parser="glm45",
        tool_call_parser="glm47",
        engram=False,
        prefix_match_multiple=16,
        prefix_match_reason="the DSA indexer's pool (index_kpool)",
        checkpoint="",
        draft_model="",
        patches=("0004",),
        patches_reason=(
            "vLLM 0.33.0 runs glm5next with a DFlash2 draft unpatched; 0004 keeps sub-block "
            "prefix hits with the draft loaded; 0001-0003 change qwen4_exp only, and glm5next "
            "defines no block-size alignment for 0003's hook"
        ),
        block_sizes_file="block-sizes-glm-5.3-flash.yaml",
    ),
}


def profile(name: str) -> ModelProfile:
    try:
        return PROFILES[name]  # type: ignore[index]
    except KeyError:
        raise UserError(
            f"model profile {name!r} is not known: use one of {', '.join(PROFILE_NAMES)}"
        ) from None


def profile_of_model_type(model_type: str | None) -> ModelProfile | None:
    return next((p for p in PROFILES.values() if model_type in p.model_types), None)


def chart_profiles() -> dict[str, object]:
    """files/model-profiles.yaml: what the chart's templates read of each profile."""
    return {
        p.name: {
            "displayName": p.display_name,
            "gpus": list(p.gpus),
            "gpuReason": p.gpu_reason,
            "methods": list(p.methods),
            "reasoningParser": p.reasoning_parser,
            "toolCallParser": p.tool_call_parser,
            "engram": p.engram,
            "prefixMatchMultiple": p.prefix_match_multiple,
            "prefixMatchReason": p.prefix_match_reason,
            "checkpoint": p.checkpoint,
            "draftModel": p.draft_model,
            "patches": list(p.patches),
            "patchesReason": p.patches_reason,
            "blockSizes": f"files/{p.block_sizes_file}",
        }
        for p in PROFILES.values()
    }
