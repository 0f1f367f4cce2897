"""The planner facade: validate a request, pick an engine, and assemble a deployment plan."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dflash_ops.errors import UserError
from dflash_ops.plan import closed_form, vllm_engine
from dflash_ops.plan.checkpoint import HybridCheckpoint
from dflash_ops.plan.gpus import gpu_profile
from dflash_ops.plan.model import MAX_K, BlockSizeInputs, BlockSizePlan, KvCacheDtype, SpecMethod

EngineName = Literal["auto", "vllm", "closed-form"]
Engine = Callable[[HybridCheckpoint, BlockSizeInputs], BlockSizePlan]

GIB = 1024**3
# Memory the estimate sets aside for activations, CUDA graphs and the allocator, per rank.
RUNTIME_RESERVE_GIB = 4.0


def parse_k(text: str) -> list[int]:
    """`7` or a range `4-8` (inclusive) of num_speculative_tokens values."""
    try:
        if "-" in text:
            low, high = (int(part) for part in text.split("-", 1))
        else:
            low = high = int(text)
    except ValueError:
        raise UserError(f"--k {text!r}: expected a number like 7 or a range like 4-8") from None
    if not 0 <= low <= high <= MAX_K:
        raise UserError(f"--k {text!r}: values must satisfy 0 <= low <= high <= {MAX_K}")
    return list(range(low, high + 1))


def validate_tp(ckpt: HybridCheckpoint, tp: int) -> None:
    heads = {
        "num_attention_heads": ckpt.num_attention_heads,
        "linear_num_key_heads": ckpt.linear_num_key_heads,
        "linear_num_value_heads": ckpt.linear_num_value_heads,
    }
    bad = [f"{name}={value}" for name, value in heads.items() if tp < 1 or value % tp]
    if bad:
        valid = [t for t in (1, 2, 4, 8, 16) if all(v % t == 0 for v in heads.values())]
        raise UserError(
            f"--tp {tp} does not divide {', '.join(bad)}; valid tensor-parallel sizes for "
            f"this checkpoint: {', '.join(map(str, valid))}"
        )


def select_engine(name: EngineName) -> tuple[str, Engine]:
    if name == "closed-form":
        return "closed-form", closed_form.plan_block_size
    if vllm_engine.vllm_available():
        return "vllm", vllm_engine.plan_block_size
    if name == "vllm":
        raise UserError(
            f"--engine vllm needs vllm=={vllm_engine.REQUIRED_VLLM_VERSION} importable "
            "(run in .venv-vllm033, or use --engine closed-form)"
        )
    return "closed-form", closed_form.plan_block_size


class KvCacheEstimate(BaseModel):
    """A rough, labelled estimate of the KV-cache capacity per rank."""

    model_config = ConfigDict(frozen=True)

    gpu_memory_gib: float
    gpu_memory_utilization: float
    weights_gib_per_rank: float
    draft_weights_gib_per_rank: float
    runtime_reserve_gib: float
    kv_budget_gib_per_rank: float
    kv_cache_tokens: int = Field(description="attention tokens that fit in the budget")
    mamba_state_bytes_per_request: int
    note: str


class DeploymentPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    checkpoint: str
    gpu: str
    tp: int
    kv_cache_dtype: KvCacheDtype
    method: SpecMethod
    engine: str
    plans: list[BlockSizePlan]
    recommended_block_size: dict[int, int]
    kv_cache: dict[int, KvCacheEstimate]
    vllm_args: dict[int, list[str]]


# The public DFlash2 draft of Qwen3.8-Flash-Next (block 8), the chart's default.
DEFAULT_DRAFT_MODEL = "incoai/Qwen3.8-Flash-Next-DFlash2"


def estimate_weights_gib_per_rank(ckpt: HybridCheckpoint, tp: int, expert_bits: int) -> float:
    """Dense weights in the checkpoint dtype split over TP; routed experts at `expert_bits`
    (4 for the AWQ W4A16 build) split over the expert-parallel ranks. The PLE n-gram table is
    left out: `--engram-config {"cpu_offload": true}` (the default) keeps it in host memory."""
    h = ckpt.hidden_size
    experts = ckpt.num_hidden_layers * ckpt.num_experts * 3 * h * ckpt.moe_intermediate_size
    shared = ckpt.num_hidden_layers * 3 * h * ckpt.shared_expert_intermediate_size
    key_dim = ckpt.linear_num_key_heads * ckpt.linear_key_head_dim
    value_dim = ckpt.linear_num_value_heads * ckpt.linear_value_head_dim
    gdn = ckpt.num_linear_layers * (h * (2 * key_dim + 2 * value_dim) + value_dim * h)
    q_dim = ckpt.num_attention_heads * ckpt.head_dim
    kv_dim = ckpt.num_key_value_heads * ckpt.head_dim
    attn = ckpt.num_attention_layers * (h * (2 * q_dim + 2 * kv_dim) + q_dim * h)
    embeddings = 2 * ckpt.vocab_size * h
    dense_bytes = (shared + gdn + attn + embeddings) * 2
    expert_bytes = experts * expert_bits / 8 * 1.03  # group scales and zeros
    return (dense_bytes + expert_bytes) / tp / GIB


def estimate_kv_cache(
    ckpt: HybridCheckpoint,
    plan: BlockSizePlan,
    *,
    gpu_memory_gib: float,
    utilization: float,
    weights_gib: float,
    draft_weights_gib: float,
) -> KvCacheEstimate:
    budget = gpu_memory_gib * utilization - weights_gib - draft_weights_gib - RUNTIME_RESERVE_GIB
    budget = max(budget, 0.0)
    per_token = ckpt.num_attention_layers * plan.attention_page_bytes_per_token
    block_bytes = plan.recommended_block_size * plan.attention_page_bytes_per_token
    mamba_layers = ckpt.num_linear_layers + len(ckpt.ple_layer_ids)
    return KvCacheEstimate(
        gpu_memory_gib=gpu_memory_gib,
        gpu_memory_utilization=utilization,
        weights_gib_per_rank=round(weights_gib, 2),
        draft_weights_gib_per_rank=draft_weights_gib,
        runtime_reserve_gib=RUNTIME_RESERVE_GIB,
        kv_budget_gib_per_rank=round(budget, 2),
        kv_cache_tokens=int(budget * GIB // per_token),
        mamba_state_bytes_per_request=mamba_layers * block_bytes,
        note=(
            "estimate: leaves out the QSA indexer and compressed-key side caches, CUDA-graph "
            "and activation peaks beyond the fixed reserve, and the hybrid allocator's group "
            "padding; each running request also pins one padded Mamba page per GDN/PLE layer "
            "(mamba_state_bytes_per_request), which grows with k through the block size. "
            "The draft costs its weights here; a draft with its own KV layers costs more."
        ),
    )


def vllm_args(plan: BlockSizePlan, method: SpecMethod, draft_model: str | None) -> list[str]:
    args = [
        "--tensor-parallel-size",
        str(plan.tp),
        "--enable-expert-parallel",
        "--mamba-cache-mode",
        "align",
        "--block-size",
        str(plan.recommended_block_size),
    ]
    if plan.kv_cache_dtype != "auto":
        args += ["--kv-cache-dtype", plan.kv_cache_dtype]
    if method != "off" and plan.k > 0:
        spec: dict[str, object] = {"method": method, "num_speculative_tokens": plan.k}
        if method == "dflash":
            spec["model"] = draft_model or DEFAULT_DRAFT_MODEL
        elif method == "ngram":
            spec |= {"prompt_lookup_max": 4, "prompt_lookup_min": 2}
        args += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    # The PLE n-gram table in pinned host memory (vLLM 0.33.0's EngramConfig).
    args += ["--engram-config", '{"cpu_offload":true}']
    return args


def make_plan(
    ckpt: HybridCheckpoint,
    *,
    gpu: str,
    tp: int,
    ks: list[int],
    kv_cache_dtype: KvCacheDtype = "auto",
    method: SpecMethod = "dflash",
    draft_model: str | None = None,
    engine: EngineName = "auto",
    gpu_memory_gib: float | None = None,
    utilization: float = 0.90,
    weights_gib: float | None = None,
    expert_bits: int = 4,
    draft_weights_gib: float = 1.0,
) -> DeploymentPlan:
    profile = gpu_profile(gpu)
    validate_tp(ckpt, tp)
    if method == "off":
        ks = [0]
    if not 0 < utilization <= 1:
        raise UserError(f"--gpu-memory-utilization {utilization}: must be in (0, 1]")
    engine_name, compute = select_engine(engine)
    plans = [
        compute(ckpt, BlockSizeInputs(gpu=profile.name, tp=tp, kv_cache_dtype=kv_cache_dtype, k=k))
        for k in ks
    ]
    weights = (
        weights_gib
        if weights_gib is not None
        else estimate_weights_gib_per_rank(ckpt, tp, expert_bits)
    )
    draft = 0.0 if method in ("off", "ngram") else draft_weights_gib
    return DeploymentPlan(
        checkpoint=ckpt.source,
        gpu=profile.name,
        tp=tp,
        kv_cache_dtype=kv_cache_dtype,
        method=method,
        engine=engine_name,
        plans=plans,
        recommended_block_size={p.k: p.recommended_block_size for p in plans},
        kv_cache={
            p.k: estimate_kv_cache(
                ckpt,
                p,
                gpu_memory_gib=gpu_memory_gib or profile.memory_gib,
                utilization=utilization,
                weights_gib=weights,
                draft_weights_gib=draft,
            )
            for p in plans
        },
        vllm_args={p.k: vllm_args(p, method, draft_model) for p in plans},
    )
