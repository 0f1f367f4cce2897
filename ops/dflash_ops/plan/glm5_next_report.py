"""`dflash-serve plan` for a GLM-5.3-Flash checkpoint: the block size and the KV cache per k, what
vLLM 0.33.0 refuses said in one line, and what is not planned for it yet said in the output."""

from __future__ import annotations

import json
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict

from dflash_ops.errors import UserError
from dflash_ops.model_profiles import PROFILES
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
from dflash_ops.plan.output import columns, engine_values, one_plan, render_capacity
from dflash_ops.plan.planner import (
    DEFAULT_PREFIX_MATCH_UNIT,
    CapacityAssumptions,
    EngineName,
    capacity_inputs,
    resolve_engine,
    validate_tp_heads,
)
from dflash_ops.speculative_setting import SpeculativeSetting
from dflash_ops.vocabulary import ChartMethod

NOT_PLANNED = "a k schedule is planned for Qwen3.8-Flash-Next only so far"
TP_SIZES = (1, 2, 4, 8)
METHODS = PROFILES["glm-5.3-flash"].methods
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
    draft_model: str | None
    prefix_match_unit: int | None


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
    draft_model: str | None = None,
    prefix_match_unit: int | None = DEFAULT_PREFIX_MATCH_UNIT,
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
    if prefix_match_unit:
        for plan in plans:
            check_prefix_match_unit(prefix_match_unit, plan.recommended_block_size, plan.k)
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
        draft_model=draft_model if method == "dflash" else None,
        prefix_match_unit=prefix_match_unit or None,
    )


def check_prefix_match_unit(unit: int, block: int, k: int) -> None:
    """vLLM 0.33.0 (resolve_kv_cache_block_sizes): the unit divides every prefix-cached group's
    block size and lands on whole pooled indexer states."""
    pool = PROFILES["glm-5.3-flash"].prefix_match_multiple
    if unit < 1 or block % unit or unit % pool:
        raise UserError(
            f"--prefix-match-unit {unit} is not valid with block size {block} (k={k}): it "
            f"must divide the block size and be a multiple of the DSA indexer's pool "
            f"(index_kpool) {pool}, e.g. 16; or --prefix-match-unit 0 for whole-block hits"
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
    if plan.prefix_match_unit:
        unit = plan.prefix_match_unit
        out.append(
            f"Prefix-cache hits land on multiples of {unit} tokens (--prefix-match-unit {unit}), "
            "not on whole blocks; with a DFlash2 draft this needs patch 0004."
        )
    out += ["", *render_capacity(plan)]
    return "\n".join(out) + "\n"


def render_helm_values(plan: Glm5NextPlan) -> str:
    """Chart values for the planned deployment (model.profile glm-5.3-flash), to merge with
    yours, which name the checkpoint (model.name, model.servedName)."""
    only = one_plan(plan.plans)
    speculative = SpeculativeSetting(only.k, plan.method, None).chart_values(plan.draft_model)
    values = {
        "model": {"profile": "glm-5.3-flash"},
        "gpu": {"type": plan.gpu},
        "engine": engine_values(
            plan.tp, plan.kv_cache_dtype, only.recommended_block_size, plan.prefix_match_unit
        ),
        "speculative": speculative,
    }
    header = (
        f"# dflash-serve plan: {DISPLAY_NAME} on {plan.gpu} TP{plan.tp} k={only.k} "
        f"({plan.engine} engine)\n"
        "# helm install RELEASE charts/dflash-serve -f THIS_FILE -f YOURS (YOURS names "
        "model.name and model.servedName)\n"
    )
    return header + yaml.safe_dump(values, sort_keys=False)


def check_format(fmt: str, method: str, draft_model: str | None) -> None:
    """Before planning: chart values for a DFlash2 deployment need the draft's name."""
    if fmt == "helm-values" and method == "dflash" and not draft_model:
        raise UserError(
            f"--format helm-values with --method dflash needs --draft-model: no public "
            f"{DISPLAY_NAME} DFlash2 draft is assumed; name yours"
        )


def render(plan: Glm5NextPlan, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(plan.model_dump(mode="json"), indent=2) + "\n"
    if fmt == "helm-values":
        check_format(fmt, plan.method, plan.draft_model)
        return render_helm_values(plan)
    return render_table(plan)
