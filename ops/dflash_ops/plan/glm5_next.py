"""GLM-5.3-Flash (vLLM 0.33.0's `glm5next`): the checkpoint fields its block size depends on, and
a closed form of the block size vLLM 0.33.0 picks for it.

The model is hybrid: KDA linear-attention layers keep a Mamba-style state per request, and its
sparse MLA layers keep one latent vector per token beside a DSA indexer cache. vLLM aligns the
attention block so that a block's MLA page holds the KDA state (`_align_hybrid_block_size`), on
a grid every attention backend takes: the indexer's paged-MQA kernel reads pages of 32 or 64
pooled entries of `index_kpool` tokens each (`Glm5NextIndexerBackend`), so blocks are multiples
of `32 * index_kpool` (512 tokens for GLM-5.3-Flash). The indexer's tail ring
(`Glm5NextTailCache`: `index_kpool * next_pow2(ceil((index_kpool + k) / index_kpool))`) must
divide the block: it does for every k up to 15, so unlike Qwen4Exp's QSA ring nothing here
needs a patch. `tests/ops/plan/test_glm5_next_engines_agree.py` holds this to vLLM's own code.
"""

from __future__ import annotations

import json
from importlib import resources
from math import lcm
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dflash_ops.errors import UserError
from dflash_ops.plan.model import BlockSizeInputs, KvCacheDtype

MODEL_TYPES = ("glm5_next", "glm5_next_text")
DISPLAY_NAME = "GLM-5.3-Flash"
REFERENCE_CONFIG_NAME = "glm-5.3-flash.config.json"

# vLLM 0.33.0 serves sparse MLA (a config with `index_topk`) only with a sparse MLA backend;
# `vllm/platforms/cuda.py` lists them, and each one's `supports_compute_capability` takes SM90
# (FlashInfer SM90, FlashAttention, FlashMLA sparse) or SM100 (FlashMLA, FlashInfer TRT-LLM,
# FA4 sparse): none takes the A100's SM80.
SPARSE_MLA_GPUS = ("h100", "h200", "b200")

# Hybrid MLA blocks are multiples of 128 (TRT-LLM/FlashInfer MLA decode kernels), whatever the
# backends accept (`_align_hybrid_block_size`).
MLA_HYBRID_ALIGNMENT = 128
# `get_paged_mqa_page_sizes` off SM120: the indexer's kernel pages, in pooled entries.
INDEXER_PAGE_ENTRIES = (32, 64)
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1}


class SparseMlaBackend(BaseModel):
    """The sparse MLA backend vLLM 0.33.0 picks first on a GPU (`_get_backend_priorities`:
    on SM90 with a 512-wide latent FlashInfer's SM90 kernel leads; on SM100 FlashInfer's TRT-LLM
    kernel for an fp8 KV cache, FlashMLA for bfloat16 above 16 heads per rank, FA4 at or
    below), and its smallest kernel block."""

    model_config = ConfigDict(frozen=True)

    name: str
    kernel_block: int
    # Its `customize_spec` (`align_blocks_to_rows`): blocks lie whole rows of this many tokens
    # apart; the TRT-LLM launchers read pages of their kernel block.
    stride_rows: int


def sparse_mla_backend(gpu: str, kv_cache_dtype: str, heads_per_rank: int) -> SparseMlaBackend:
    if gpu in ("h100", "h200"):
        return SparseMlaBackend(name="FLASHINFER_MLA_SPARSE_SM90", kernel_block=64, stride_rows=1)
    if kv_cache_dtype == "fp8":
        return SparseMlaBackend(name="FLASHINFER_MLA_SPARSE", kernel_block=32, stride_rows=32)
    if heads_per_rank > 16:
        return SparseMlaBackend(name="FLASHMLA_SPARSE", kernel_block=64, stride_rows=1)
    return SparseMlaBackend(name="FLASH_ATTN_MLA_SPARSE_FA4", kernel_block=64, stride_rows=64)


class Glm5NextCheckpoint(BaseModel):
    """Text-config fields of a GLM-5.3-Flash checkpoint that size its pages."""

    model_config = ConfigDict(frozen=True)

    source: str
    model_type: str
    architecture: str
    dtype: str
    num_attention_heads: int = Field(ge=1, le=1 << 16)
    kv_lora_rank: int = Field(ge=1, le=1 << 16)
    qk_rope_head_dim: int = Field(ge=0, le=1 << 16)
    linear_num_heads: int = Field(ge=1, le=1 << 16)
    linear_head_dim: int = Field(ge=1, le=1 << 16)
    linear_conv_kernel_dim: int = Field(ge=1, le=1 << 10)
    index_kpool: int = Field(ge=2, le=1 << 10)
    index_n_heads: int = Field(ge=1, le=1 << 16)
    index_topk: int | None = None
    # What the KV-cache plan reads besides: which layers are KDA, the indexer's width, the
    # KDA kernel's gate (FlashKDA needs a bounded one), the default length.
    num_hidden_layers: int = Field(ge=1, le=1 << 12)
    layer_types: tuple[str, ...]
    index_head_dim: int = Field(ge=1, le=1 << 16)
    linear_lower_bound: float | None = None
    max_position_embeddings: int = Field(ge=1, le=1 << 26)
    # And the weights estimate.
    hidden_size: int = Field(ge=1, le=1 << 20)
    vocab_size: int = Field(ge=1, le=1 << 24)
    intermediate_size: int = Field(ge=0, le=1 << 24)
    moe_intermediate_size: int = Field(ge=0, le=1 << 24)
    n_routed_experts: int = Field(ge=0, le=1 << 16)
    n_shared_experts: int = Field(ge=0, le=1 << 10)
    mlp_layer_types: tuple[str, ...]
    q_lora_rank: int | None = Field(default=None, ge=1, le=1 << 16)
    qk_nope_head_dim: int = Field(ge=0, le=1 << 16)
    v_head_dim: int = Field(ge=1, le=1 << 16)
    tie_word_embeddings: bool = False

    @model_validator(mode="after")
    def _layers_match(self) -> Glm5NextCheckpoint:
        for name in ("layer_types", "mlp_layer_types"):
            if len(getattr(self, name)) != self.num_hidden_layers:
                raise ValueError(
                    f"{name} has {len(getattr(self, name))} entries for num_hidden_layers "
                    f"{self.num_hidden_layers}"
                )
        return self

    @property
    def sparse(self) -> bool:
        return self.index_topk is not None

    @property
    def kda_layer_ids(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")

    def tp_heads(self) -> dict[str, int]:
        """The head counts a tensor-parallel size must divide."""
        return {
            "num_attention_heads": self.num_attention_heads,
            "linear_num_heads": self.linear_num_heads,
            "index_n_heads": self.index_n_heads,
        }


_FIELDS = [
    name for name in Glm5NextCheckpoint.model_fields if name not in {"source", "architecture"}
]


def reference_config_path() -> Path:
    return Path(str(resources.files("dflash_ops.data") / REFERENCE_CONFIG_NAME))


def load_glm5_next(path: str | Path | None = None) -> Glm5NextCheckpoint:
    """Read and validate a checkpoint config; the bundled one when `path` is None."""
    from dflash_ops.plan.checkpoint import read_config

    if path is None:
        config_path = reference_config_path()
        return read_glm5_next(config_path, json.loads(config_path.read_text()))
    return read_glm5_next(*read_config(path, "checkpoint config"))


def _with_defaults(text: dict[str, Any]) -> dict[str, Any]:
    """What transformers' `Glm5NextTextConfig` fills in: its defaults (the bundled config is
    them) and the layer patterns its `__post_init__` derives from the layer count."""
    reference = json.loads(reference_config_path().read_text())
    defaults = reference.get("text_config", reference)
    filled = dict(text)
    linear = text.get("linear_attn_config")
    if isinstance(linear, dict):
        renamed = {
            "head_dim": "linear_head_dim",
            "num_heads": "linear_num_heads",
            "short_conv_kernel_size": "linear_conv_kernel_dim",
            "gate_lower_bound": "linear_lower_bound",
        }
        filled |= {ours: linear[theirs] for theirs, ours in renamed.items() if theirs in linear}
        if linear.get("safe_gate", True) and filled.get("linear_lower_bound") is None:
            filled["linear_lower_bound"] = defaults["linear_lower_bound"]
    layers = filled.get("num_hidden_layers", defaults["num_hidden_layers"])
    if isinstance(layers, int) and 0 < layers <= 1 << 12:
        if filled.get("layer_types") is None:
            filled["layer_types"] = [
                "linear_attention" if i % 4 != 3 else "indexed_attention" for i in range(layers)
            ]
        if filled.get("mlp_layer_types") is None:
            filled["mlp_layer_types"] = ["dense"] * min(3, layers) + ["sparse"] * (layers - 3)
    if isinstance(filled.get("layer_types"), list):
        filled["layer_types"] = [
            "indexed_attention" if t == "full_attention" else t for t in filled["layer_types"]
        ]
    return {name: filled.get(name, value) for name, value in defaults.items()} | filled


def read_glm5_next(config_path: Path, raw: dict[str, Any]) -> Glm5NextCheckpoint:
    text: dict[str, Any] = _with_defaults(raw.get("text_config", raw))
    fields = {name: text[name] for name in _FIELDS if text.get(name) is not None}
    fields.setdefault("model_type", raw.get("model_type"))
    fields.setdefault("dtype", text.get("torch_dtype", raw.get("dtype", "bfloat16")))
    architectures = raw.get("architectures") or ["Glm5NextForCausalLM"]
    try:
        return Glm5NextCheckpoint(
            source=str(config_path), architecture=str(architectures[0]), **fields
        )
    except ValidationError as err:
        problem = err.errors()[0]
        where = ".".join(str(part) for part in problem["loc"]) or "config"
        raise UserError(f"{config_path}: {where}: {problem['msg']}") from None


class Glm5NextBlockSizePlan(BaseModel):
    """The block-size terms for one configuration; all byte sizes are per rank."""

    model_config = ConfigDict(frozen=True)

    gpu: str
    tp: int
    kv_cache_dtype: KvCacheDtype = Field(description="as asked")
    effective_kv_cache_dtype: str = Field(description="what vLLM runs (fp8 by default on B200)")
    k: int
    mla_page_bytes_per_token: int = Field(description="the latent vector of one token")
    kda_state_bytes: int = Field(description="KDA conv + recurrent state per request")
    sparse_mla_backend: str
    kernel_alignment: int = Field(description="the grid every attention backend takes")
    automatic_block_size: int = Field(description="what vLLM 0.33.0 picks")
    tail_ring: int = Field(description="the indexer's tail ring for this k")
    automatic_is_valid: bool = Field(description="the tail ring divides the block")
    recommended_block_size: int
    engine: Literal["vllm", "closed-form"]

    @classmethod
    def from_terms(
        cls,
        inputs: BlockSizeInputs,
        *,
        effective_kv_cache_dtype: str,
        page: int,
        state: int,
        backend: str,
        alignment: int,
        grid: int,
        automatic: int,
        index_kpool: int,
        engine: Literal["vllm", "closed-form"],
    ) -> Glm5NextBlockSizePlan:
        """The plan from an engine's terms; the tail ring (Glm5NextTailCache computes it inside
        a GPU layer) and what follows from it are computed here for both engines."""
        ring = tail_ring(index_kpool, inputs.k)
        step = lcm(grid, ring)
        return cls(
            gpu=inputs.gpu,
            tp=inputs.tp,
            kv_cache_dtype=inputs.kv_cache_dtype,
            effective_kv_cache_dtype=effective_kv_cache_dtype,
            k=inputs.k,
            mla_page_bytes_per_token=page,
            kda_state_bytes=state,
            sparse_mla_backend=backend,
            kernel_alignment=alignment,
            automatic_block_size=automatic,
            tail_ring=ring,
            automatic_is_valid=automatic % ring == 0,
            recommended_block_size=step * -(-automatic // step),
            engine=engine,
        )

    def comparable(self) -> dict[str, object]:
        return self.model_dump(exclude={"engine"})


def effective_kv_cache_dtype(ckpt: Glm5NextCheckpoint, gpu: str, asked: str) -> str:
    """`Glm5NextModelConfig`: an automatic KV cache of a sparse GLM-5.3-Flash runs in fp8 on
    SM100 (B200)."""
    if asked == "auto" and gpu == "b200" and ckpt.sparse:
        return "fp8"
    return ckpt.dtype if asked == "auto" else asked


def tail_ring(index_kpool: int, k: int) -> int:
    pools = -(-(index_kpool + k) // index_kpool)
    return index_kpool * (1 << (pools - 1).bit_length())


def kda_state_bytes(ckpt: Glm5NextCheckpoint, tp: int, k: int) -> int:
    # MambaStateShapeCalculator.kda_state_shape: q, k and v convolved (the model dtype), the
    # recurrent state per head in float32 (kda_state_dtype with mamba_ssm_cache_dtype auto).
    projection = ckpt.linear_num_heads * ckpt.linear_head_dim
    conv = 3 * projection // tp * (ckpt.linear_conv_kernel_dim - 1 + k) * DTYPE_BYTES[ckpt.dtype]
    recurrent = ckpt.linear_num_heads // tp * ckpt.linear_head_dim**2 * DTYPE_BYTES["float32"]
    return conv + recurrent


def plan_block_size(ckpt: Glm5NextCheckpoint, inputs: BlockSizeInputs) -> Glm5NextBlockSizePlan:
    kv_dtype = effective_kv_cache_dtype(ckpt, inputs.gpu, inputs.kv_cache_dtype)
    backend = sparse_mla_backend(inputs.gpu, kv_dtype, ckpt.num_attention_heads // inputs.tp)
    page = (ckpt.kv_lora_rank + ckpt.qk_rope_head_dim) * DTYPE_BYTES[kv_dtype]
    state = kda_state_bytes(ckpt, inputs.tp, inputs.k)
    # Phase 1: the smallest size every backend takes (the tail ring's backend takes any).
    grid = lcm(backend.kernel_block, ckpt.index_kpool * min(INDEXER_PAGE_ENTRIES))
    alignment = max(grid, MLA_HYBRID_ALIGNMENT)
    block = alignment * -(-state // (alignment * page))
    block = grid * -(-block // grid)
    return Glm5NextBlockSizePlan.from_terms(
        inputs,
        effective_kv_cache_dtype=kv_dtype,
        page=page,
        state=state,
        backend=backend.name,
        alignment=alignment,
        grid=grid,
        automatic=block,
        index_kpool=ckpt.index_kpool,
        engine="closed-form",
    )
