"""The speculative draft's KV layers and weights, read from its config.json.

A DFlash draft's attention layers get their own KV-cache group in vLLM 0.33.0: a sliding-window
layer holds only its window plus the tokens in flight, a full-attention layer the whole
context. Which one a layer is follows `_resolve_layer_attention` in
`vllm/model_executor/models/qwen3_dflash.py` (`layer_types`, `dflash_config.use_swa`, the window
from `dflash_config.swa_window_size` or `sliding_window`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dflash_ops.errors import UserError
from dflash_ops.plan.checkpoint import read_config

GIB = 1024**3
DraftLayerKind = Literal["sliding", "full"]


class DraftProfile(BaseModel):
    """What a draft adds to the KV cache (per layer) and to the weights (per rank)."""

    model_config = ConfigDict(frozen=True)

    name: str
    source: str = Field(description="the config it was read from, or why it is assumed")
    layer_kinds: tuple[DraftLayerKind, ...]
    sliding_window: int | None
    num_key_value_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    weights_bytes: int = Field(ge=0, description="all ranks together, in the checkpoint dtype")

    def num_kv_heads_per_rank(self, tp: int) -> int:
        # ModelConfig.get_num_kv_heads: split over TP ranks, replicated when fewer than ranks.
        return max(1, self.num_key_value_heads // tp)

    def weights_gib_per_rank(self, tp: int) -> float:
        return self.weights_bytes / tp / GIB


def _weights_bytes(config: dict[str, Any], num_layers: int, head_dim: int) -> int:
    """bf16 bytes of the draft's own weights: the fc that folds the captured target layers into
    one hidden state, and its decoder layers (embeddings and lm_head are the target's)."""
    hidden = int(config["hidden_size"])
    heads = int(config.get("num_attention_heads", 1))
    kv_heads = int(config.get("num_key_value_heads", heads))
    intermediate = int(config.get("intermediate_size", 0))
    dflash = config.get("dflash_config") or {}
    captured = len(dflash.get("target_layer_ids") or []) or num_layers
    fc = captured * hidden * hidden
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    mlp = 3 * hidden * intermediate
    return 2 * (fc + num_layers * (attention + mlp))


def draft_profile_from_config(config: dict[str, Any], source: str) -> DraftProfile:
    """Mirror of vLLM 0.33.0's per-layer rule for DFlash drafts."""
    try:
        num_layers = int(config["num_hidden_layers"])
        hidden = int(config["hidden_size"])
        heads = int(config.get("num_attention_heads", 1))
    except (KeyError, TypeError, ValueError, OverflowError) as err:
        raise UserError(
            f"draft config {source}: needs num_hidden_layers and hidden_size ({err})"
        ) from None
    # A draft has a handful of layers; sizes beyond these are not a checkpoint.
    if not (1 <= num_layers <= 256 and 1 <= hidden <= 1 << 20 and 1 <= heads <= 1 << 12):
        raise UserError(
            f"draft config {source}: num_hidden_layers {num_layers}, hidden_size {hidden}, "
            f"num_attention_heads {heads}: outside what a draft model can be (1-256 layers)"
        )
    dflash = config.get("dflash_config") or {}
    layer_types = config.get("layer_types")
    use_swa = bool(dflash.get("use_swa", False))
    if layer_types is not None and len(layer_types) != num_layers:
        raise UserError(
            f"draft config {source}: layer_types has {len(layer_types)} entries for "
            f"{num_layers} layers"
        )
    any_sliding = any(t == "sliding_attention" for t in layer_types or [])
    if layer_types is None or (use_swa and not any_sliding):
        kinds: tuple[DraftLayerKind, ...] = ("sliding" if use_swa else "full",) * num_layers
    else:
        kinds = tuple("sliding" if t == "sliding_attention" else "full" for t in layer_types)
    window = dflash.get("swa_window_size", config.get("sliding_window"))
    if "sliding" in kinds and not window:
        raise UserError(
            f"draft config {source}: sliding-window layers need a window: set "
            "dflash_config.swa_window_size or sliding_window"
        )
    try:
        head_dim = int(config.get("head_dim") or hidden // heads)
        kv_heads = int(config.get("num_key_value_heads", heads))
        weights = _weights_bytes(config, num_layers, head_dim)
    except (TypeError, ValueError, OverflowError, AttributeError) as err:
        raise UserError(f"draft config {source}: {type(err).__name__}: {err}") from None
    return DraftProfile(
        name=str(config.get("_name_or_path") or Path(source).parent.name or source),
        source=source,
        layer_kinds=kinds,
        sliding_window=int(window) if window and "sliding" in kinds else None,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        weights_bytes=weights,
    )


def load_draft_profile(path: str | Path) -> DraftProfile:
    config_path, raw = read_config(path, "--draft-config")
    return draft_profile_from_config(raw, str(config_path))


# The public DFlash2 draft of Qwen3.8-Flash-Next is known by its captured layers (5), its fc
# (2560 x 12800) and its block size (8); its attention layout here is an assumption, stated in
# `source` and the plan's output: five sliding-window layers of window 2048 with the target's
# hidden size, 2 KV heads of 128, a 9728-wide MLP. Pass --draft-config for the real one.
DEFAULT_DFLASH2_CONFIG: dict[str, Any] = {
    "_name_or_path": "incoai/Qwen3.8-Flash-Next-DFlash2",
    "num_hidden_layers": 5,
    "hidden_size": 2560,
    "num_attention_heads": 20,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "intermediate_size": 9728,
    "layer_types": ["sliding_attention"] * 5,
    "sliding_window": 2048,
    "dflash_config": {"target_layer_ids": [5, 15, 25, 35, 45]},
}


def assumed_profile(config: dict[str, Any]) -> DraftProfile:
    """A draft whose layout is assumed, saying so where the plan prints its source."""
    profile = draft_profile_from_config(config, "assumed")
    return profile.model_copy(
        update={"source": "an assumed layout: pass --draft-config with the draft's config.json"}
    )


def default_dflash2_profile() -> DraftProfile:
    return assumed_profile(DEFAULT_DFLASH2_CONFIG)
