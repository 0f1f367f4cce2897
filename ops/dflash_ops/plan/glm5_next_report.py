"""`dflash-serve plan` for a GLM-5.3-Flash checkpoint: the block size and the KV cache per k, what
vLLM 0.33.0 refuses said in one line, and what is not planned for it yet said in the output."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from dflash_ops.errors import UserError
from dflash_ops.plan import glm5_next_capacity
from dflash_ops.plan.draft import DraftProfile
from dflash_ops.plan.glm5_next import (
    DISPLAY_NAME,
    SPARSE_MLA_GPUS,
    Glm5NextBlockSizePlan,
    Glm5NextCheckpoint,
    plan_block_size,
)
from dflash_ops.plan.glm5_next_capacity import default_glm_dflash2_profile
from dflash_ops.plan.kv_capacity import KvCapacity
from dflash_ops.plan.model import BlockSizeInputs, KvCacheDtype
from dflash_ops.plan.output import columns, render_capacity
from dflash_ops.plan.planner import (
    CapacityAssumptions,
    EngineName,
    capacity_inputs,
    resolve_engine,
    validate_tp_heads,
)
from dflash_ops.vocabulary import ChartMethod

NOT_PLANNED = (
    "chart values are planned for Qwen3.8-Flash-Next only so far; "
    "for GLM-5.3-Flash this plan gives the block size and the KV cache"
)
TP_SIZES = (1, 2, 4, 8)
METHODS = ("dflash", "ngram", "off")
# No quantized build is assumed: the routed experts in the checkpoint's bfloat16.
EXPERT_BITS = 16


class Glm5NextPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    model: str
    checkpoint: str
    gpu: str
    tp: int
    kv_cache_dtype: KvCacheDtype
    method: ChartMethod
    engine: Literal["vllm", "closed-form"]
    plans: list[Glm5NextBlockSizePlan]
    capacity_assumptions: CapacityAssumptions
    capacity: dict[int, KvCapacity]
    not_planned: str = NOT_PLANNED


def check_supported(ckpt: Glm5NextCheckpoint, gpu: str, tp: int) -> None:
    if ckpt.sparse and gpu not in SPARSE_MLA_GPUS:
        raise UserError(
            f"--gpu {gpu}: {DISPLAY_NAME}'s attention is sparse MLA (index_topk "
            f"{ckpt.index_topk}) and vLLM 0.33.0 has no sparse MLA backend for it (they need "
            f"SM90 or SM100): use --gpu {', '.join(SPARSE_MLA_GPUS)}"
        )
    validate_tp_heads(ckpt.tp_heads(), tp, DISPLAY_NAME, TP_SIZES)


def make_glm5_next_plan(
    ckpt: Glm5NextCheckpoint,
    *,
    gpu: str,
    tp: int,
    ks: list[int],
    kv_cache_dtype: KvCacheDtype,
    engine: EngineName,
    method: ChartMethod = "dflash",
    draft: DraftProfile | None = None,
    **capacity: Any,
) -> Glm5NextPlan:
    """Block sizes for each k, then vLLM's KV-cache plan for each (`capacity` takes the keyword
    arguments of `planner.capacity_inputs`)."""
    check_supported(ckpt, gpu, tp)
    if method not in METHODS:
        raise UserError(
            f"--method {method}: planned for {DISPLAY_NAME} are {', '.join(METHODS)} "
            f"({method} is planned for Qwen3.8-Flash-Next only)"
        )
    if method == "off":
        ks = [0]
    if method == "dflash" and draft is None:
        draft = default_glm_dflash2_profile()
    compute, capacity_of = plan_block_size, glm5_next_capacity.kv_capacity
    engine_name = resolve_engine(engine)
    if engine_name == "vllm":
        from dflash_ops.plan.vllm_engine import glm5_next
        from dflash_ops.plan.vllm_engine import glm5_next_capacity as exact

        compute, capacity_of = glm5_next.plan_block_size, exact.kv_capacity
    capacity.setdefault("expert_bits", EXPERT_BITS)
    assumptions = capacity_inputs(ckpt, gpu=gpu, tp=tp, method=method, draft=draft, **capacity)
    plans = [
        compute(ckpt, BlockSizeInputs(gpu=gpu, tp=tp, kv_cache_dtype=kv_cache_dtype, k=k))
        for k in ks
    ]
    return Glm5NextPlan(
        model=DISPLAY_NAME,
        checkpoint=ckpt.source,
        gpu=gpu,
        tp=tp,
        kv_cache_dtype=kv_cache_dtype,
        method=method,
        engine=engine_name,
        plans=plans,
        capacity_assumptions=assumptions,
        capacity={
            p.k: capacity_of(ckpt, p, draft=assumptions.draft, inputs=assumptions.inputs)
            for p in plans
        },
    )


def render_table(plan: Glm5NextPlan) -> str:
    first = plan.plans[0]
    out = [
        f"Checkpoint   {plan.checkpoint} ({plan.model})",
        f"Target       {plan.gpu.upper()} x TP{plan.tp}, KV cache {plan.kv_cache_dtype} "
        f"(runs {first.effective_kv_cache_dtype}), speculation {plan.method}, computed by the "
        f"{plan.engine} engine",
        "",
        f"P  MLA latent page per token          {first.mla_page_bytes_per_token} B "
        "((kv_lora_rank + qk_rope_head_dim) x KV dtype bytes, one per rank)",
        "S  KDA state per request per rank     see per-k rows (q, k, v conv + float32 "
        "recurrent state; k adds conv rows)",
        f"a  alignment                          {first.kernel_alignment} (the DSA indexer's "
        f"kernel pages of 32 pooled entries; sparse MLA backend {first.sparse_mla_backend})",
        "B  automatic block size (vLLM 0.33.0) a * ceil(S / (a * P))",
        "R  indexer tail ring                  index_kpool * next_pow2(ceil((index_kpool + k) "
        "/ index_kpool)), must divide B",
        "",
    ]
    header = ("k", "S bytes", "B auto", "R", "B starts?", "recommended")
    rows = [
        (
            str(p.k),
            str(p.kda_state_bytes),
            str(p.automatic_block_size),
            str(p.tail_ring),
            "yes" if p.automatic_is_valid else "NO",
            str(p.recommended_block_size),
        )
        for p in plan.plans
    ]
    out += columns(header, rows)
    out += ["", *render_capacity(plan), "", f"{plan.not_planned}."]
    return "\n".join(out) + "\n"


def check_format(fmt: str) -> None:
    """Before planning: a format the plan cannot be written in."""
    if fmt == "helm-values":
        raise UserError(
            f"--format helm-values: the chart deploys Qwen3.8-Flash-Next only so far; "
            f"for {DISPLAY_NAME} use --format table or json"
        )


def render(plan: Glm5NextPlan, fmt: str) -> str:
    check_format(fmt)
    if fmt == "json":
        return json.dumps(plan.model_dump(mode="json"), indent=2) + "\n"
    return render_table(plan)
