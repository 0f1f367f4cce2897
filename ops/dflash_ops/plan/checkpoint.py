"""The checkpoint fields the block-size rule depends on, read from a `config.json`."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from dflash_ops.errors import UserError

SUPPORTED_MODEL_TYPES = ("qwen4_exp", "qwen4_exp_text")
# Released configs say `full_attention`; Transformers >= 5.18 rewrites QSA layers to
# `indexed_attention` (older: `qwen_sparse_attention`).
ATTENTION_LAYER_TYPES = frozenset({"full_attention", "indexed_attention", "qwen_sparse_attention"})
REFERENCE_CONFIG_NAME = "qwen3.8-flash-next.config.json"
MAX_LAYERS = 4096


class HybridCheckpoint(BaseModel):
    """Text-config fields of a Qwen4Exp checkpoint that size its KV and Mamba pages."""

    model_config = ConfigDict(frozen=True)

    source: str
    model_type: str
    architecture: str
    dtype: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    layer_types: tuple[str, ...]
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    mamba_ssm_dtype: str
    indexer_compress_ratio: int
    ple_layer_ids: tuple[int, ...]
    ple_conv_kernel_size: int
    ngram_size: int
    hc_count: int
    num_experts: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    vocab_size: int
    # Optional fields (KV capacity): defaults are the Qwen4Exp config class's and vLLM's.
    indexer_head_dim: int = 128
    max_position_embeddings: int = 262144
    mtp_num_hidden_layers: int = 1
    uses_mrope: bool = False

    @model_validator(mode="after")
    def _sizes_within_reason(self) -> HybridCheckpoint:
        """A real checkpoint's sizes are far below these; a config claiming more (1e9 layers)
        would make the planner build per-layer tables for ever."""
        for name, value in self:
            if isinstance(value, int) and not isinstance(value, bool) and not 0 <= value <= 10**8:
                raise ValueError(f"{name} {value} is outside 0..1e8")
        for name in ("num_hidden_layers", "mtp_num_hidden_layers"):
            if getattr(self, name) > MAX_LAYERS:
                raise ValueError(f"{name} {getattr(self, name)} is above {MAX_LAYERS}")
        if len(self.layer_types) > MAX_LAYERS or len(self.ple_layer_ids) > MAX_LAYERS:
            raise ValueError(f"more than {MAX_LAYERS} layer entries")
        return self

    @property
    def num_attention_layers(self) -> int:
        return sum(1 for t in self.layer_types if t in ATTENTION_LAYER_TYPES)

    @property
    def attention_layer_ids(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t in ATTENTION_LAYER_TYPES]

    @property
    def num_linear_layers(self) -> int:
        return sum(1 for t in self.layer_types if t == "linear_attention")


_OPTIONAL = ("indexer_head_dim", "max_position_embeddings", "mtp_num_hidden_layers")
_REQUIRED = [
    name
    for name in HybridCheckpoint.model_fields
    if name not in {"source", "architecture", "uses_mrope", *_OPTIONAL}
]


def reference_config_path() -> Path:
    return Path(str(resources.files("dflash_ops.data") / REFERENCE_CONFIG_NAME))


def read_config(path: str | Path, what: str) -> tuple[Path, dict[str, Any]]:
    """A config.json (or the one in a checkpoint directory) as a JSON object; `what` names
    the input in errors."""
    from dflash_ops.files import read_json

    candidate = Path(path)
    if candidate.is_dir():
        candidate = candidate / "config.json"
    if not candidate.exists():
        raise UserError(
            f"{what} {str(path)!r} not found: pass a config.json or a checkpoint directory "
            "that contains one"
        )
    return candidate, read_json(candidate, what)


def declared_model_type(raw: dict[str, Any]) -> Any:
    """The model type a checkpoint config declares: its text config's, else its own."""
    text = raw.get("text_config", raw)
    return text.get("model_type", raw.get("model_type")) if isinstance(text, dict) else None


def load_checkpoint(path: str | Path | None = None) -> HybridCheckpoint:
    """Read and validate a checkpoint config; the bundled reference when `path` is None."""
    if path is None:
        config_path = reference_config_path()
        raw: dict[str, Any] = json.loads(config_path.read_text())
    else:
        config_path, raw = read_config(path, "checkpoint config")
    text: dict[str, Any] = raw.get("text_config", raw)
    model_type = declared_model_type(raw)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UserError(
            f"{config_path}: model_type {model_type!r} is not supported by the planner "
            f"(known: {', '.join(SUPPORTED_MODEL_TYPES)}, and GLM-5.3-Flash's glm5_next); it plans "
            "Qwen4Exp hybrid checkpoints and GLM-5.3-Flash block sizes"
        )
    missing = [name for name in _REQUIRED if name not in text and name != "model_type"]
    if missing:
        raise UserError(
            f"{config_path}: text config is missing field(s) the block-size rule needs: "
            f"{', '.join(missing)}"
        )
    architectures = raw.get("architectures") or ["Qwen4ExpForConditionalGeneration"]
    fields = {name: text[name] for name in _REQUIRED if name != "model_type"}
    fields |= {name: text[name] for name in _OPTIONAL if text.get(name) is not None}
    # vllm.transformers_utils.config.uses_mrope: an mrope_section in the rope parameters.
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    fields["uses_mrope"] = isinstance(rope, dict) and rope.get("mrope_section") is not None
    try:
        return HybridCheckpoint(
            source=str(config_path),
            model_type=str(model_type),
            architecture=str(architectures[0]),
            **fields,
        )
    except ValidationError as err:
        problem = err.errors()[0]
        where = ".".join(str(part) for part in problem["loc"]) or "config"
        raise UserError(f"{config_path}: {where}: {problem['msg']}") from None
