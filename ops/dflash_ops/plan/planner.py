"""The planner facade: validate a request, pick an engine, and assemble a deployment plan."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from dflash_ops.errors import UserError
from dflash_ops.plan import closed_form, glm5_next_capacity, kv_capacity_closed_form, vllm_engine
from dflash_ops.plan.checkpoint import HybridCheckpoint
from dflash_ops.plan.draft import DraftProfile, default_dflash2_profile
from dflash_ops.plan.glm5_next import Glm5NextCheckpoint
from dflash_ops.plan.gpus import gpu_profile
from dflash_ops.plan.kv_capacity import (
    DEFAULT_CONTEXT_LENGTHS,
    DEFAULT_PROFILE_RESERVE_GIB,
    GIB,
    SERVER_MAX_NUM_BATCHED_TOKENS,
    CapacityInputs,
    KvCapacity,
)
from dflash_ops.plan.model import BlockSizeInputs, BlockSizePlan, KvCacheDtype
from dflash_ops.plan.vllm_engine.runtime import REQUIRED_VLLM_VERSION
from dflash_ops.speculative_schedule import Schedule, ScheduleError, parse_schedule
from dflash_ops.speculative_setting import SpeculativeSetting
from dflash_ops.vocabulary import MAX_K, ChartMethod

EngineName = Literal["auto", "vllm", "closed-form"]
Engine = Callable[[HybridCheckpoint, BlockSizeInputs], BlockSizePlan]

Capacity = Callable[..., KvCapacity]


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


def tp_heads(ckpt: HybridCheckpoint) -> dict[str, int]:
    """The head counts a tensor-parallel size must divide."""
    return {
        "num_attention_heads": ckpt.num_attention_heads,
        "linear_num_key_heads": ckpt.linear_num_key_heads,
        "linear_num_value_heads": ckpt.linear_num_value_heads,
    }


def validate_tp_heads(
    heads: dict[str, int], tp: int, whose: str, sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
) -> None:
    """Refuse a tensor-parallel size that does not divide every one of `heads`, naming them
    and the valid sizes among `sizes`."""
    bad = [f"{name}={value}" for name, value in heads.items() if tp < 1 or value % tp]
    if bad:
        valid = [t for t in sizes if all(v % t == 0 for v in heads.values())]
        raise UserError(
            f"--tp {tp} does not divide {', '.join(bad)}; valid tensor-parallel sizes for "
            f"{whose}: {', '.join(map(str, valid))}"
        )


def validate_tp(ckpt: HybridCheckpoint, tp: int) -> None:
    validate_tp_heads(tp_heads(ckpt), tp, "this checkpoint")


def resolve_engine(name: EngineName) -> Literal["vllm", "closed-form"]:
    """vLLM 0.33.0's own code where it is importable (unless the closed form is asked for)."""
    if name == "closed-form":
        return "closed-form"
    if vllm_engine.vllm_available():
        return "vllm"
    if name == "vllm":
        raise UserError(
            f"--engine vllm needs vllm=={REQUIRED_VLLM_VERSION} importable "
            "(run in .venv-vllm033, or use --engine closed-form)"
        )
    return "closed-form"


def select_engine(name: EngineName) -> tuple[str, Engine, Capacity]:
    if resolve_engine(name) == "vllm":
        return "vllm", vllm_engine.plan_block_size, vllm_engine.kv_capacity
    return "closed-form", closed_form.plan_block_size, kv_capacity_closed_form.kv_capacity


class CapacityAssumptions(BaseModel):
    """The inputs behind the capacity figures, printed with them."""

    model_config = ConfigDict(frozen=True)

    inputs: CapacityInputs
    target_weights_source: str
    draft_weights_source: str
    draft: DraftProfile | None


class DeploymentPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    checkpoint: str
    gpu: str
    tp: int
    kv_cache_dtype: KvCacheDtype
    method: ChartMethod
    engine: str
    plans: list[BlockSizePlan]
    recommended_block_size: dict[int, int]
    capacity_assumptions: CapacityAssumptions
    capacity: dict[int, KvCapacity]
    prefix_match_unit: int | None
    draft_model: str | None
    vllm_args: dict[int, list[str]]
    # A k per running batch size (speculative_schedule); the plan's one k is its largest.
    schedule: list[tuple[int, int, int]] | None = None


# Prefix-cache hit granularity the plan and the chart default to: valid for every layout of
# this model (block sizes are multiples of 16, the QSA compress ratio is 4).
DEFAULT_PREFIX_MATCH_UNIT = 16

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


def estimate_mtp_weights_gib_per_rank(ckpt: HybridCheckpoint, tp: int, expert_bits: int) -> float:
    """The MTP module: QSA decoder layer(s) with their MoE, and the projection that joins the
    embedding and the hidden state (embeddings and lm_head are shared with the target)."""
    h = ckpt.hidden_size
    q_dim = ckpt.num_attention_heads * ckpt.head_dim
    kv_dim = ckpt.num_key_value_heads * ckpt.head_dim
    attention = h * (2 * q_dim + 2 * kv_dim) + q_dim * h
    experts = ckpt.num_experts * 3 * h * ckpt.moe_intermediate_size
    shared = 3 * h * ckpt.shared_expert_intermediate_size
    per_layer = (attention + shared + 2 * h * h) * 2 + experts * expert_bits / 8
    return ckpt.mtp_num_hidden_layers * per_layer / tp / GIB


def check_prefix_match_unit(unit: int, plan: BlockSizePlan, compress_ratio: int) -> None:
    """vLLM 0.33.0 (resolve_kv_cache_block_sizes): the unit divides every prefix-cached group's
    block size and lands on whole QSA compressed-key states."""
    block = plan.recommended_block_size
    if unit < 1 or block % unit or unit % compress_ratio:
        raise UserError(
            f"--prefix-match-unit {unit} is not valid with block size {block} (k={plan.k}): it "
            f"must divide the block size and be a multiple of the QSA compress ratio "
            f"{compress_ratio}, e.g. 16; or --prefix-match-unit 0 for whole-block hits"
        )


def vllm_args(
    plan: BlockSizePlan,
    method: ChartMethod,
    draft_model: str | None,
    prefix_match_unit: int | None = None,
    schedule: Schedule | None = None,
) -> list[str]:
    args = [
        "--tensor-parallel-size",
        str(plan.tp),
        "--enable-expert-parallel",
        "--mamba-cache-mode",
        "align",
        "--block-size",
        str(plan.recommended_block_size),
    ]
    if prefix_match_unit:
        args += ["--prefix-match-unit", str(prefix_match_unit)]
    if plan.kv_cache_dtype != "auto":
        args += ["--kv-cache-dtype", plan.kv_cache_dtype]
    if method == "dflash":
        draft_model = draft_model or DEFAULT_DRAFT_MODEL
    args += SpeculativeSetting(plan.k, method, schedule).engine_args(draft_model)
    # The PLE n-gram table in pinned host memory (vLLM 0.33.0's EngramConfig).
    args += ["--engram-config", '{"cpu_offload":true}']
    return args


# The CLI flag behind each capacity input, for error messages.
CAPACITY_FLAGS = {
    "gpu_memory_gib": "--gpu-memory-gib",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "target_weights_gib": "--weights-gib",
    "draft_weights_gib": "--draft-weights-gib",
    "profile_reserve_gib": "--profile-reserve-gib",
    "max_model_len": "--max-model-len",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "context_lengths": "--context-lengths",
}


def capacity_inputs(
    ckpt: HybridCheckpoint | Glm5NextCheckpoint,
    *,
    gpu: str,
    tp: int,
    method: ChartMethod,
    draft: DraftProfile | None,
    gpu_memory_gib: float | None = None,
    utilization: float = 0.90,
    weights_gib: float | None = None,
    expert_bits: int = 4,
    draft_weights_gib: float | None = None,
    mtp_expert_bits: int = 16,
    profile_reserve_gib: float = DEFAULT_PROFILE_RESERVE_GIB,
    max_model_len: int | None = None,
    max_num_batched_tokens: int | None = None,
    context_lengths: tuple[int, ...] = DEFAULT_CONTEXT_LENGTHS,
) -> CapacityAssumptions:
    """The capacity inputs with their defaults resolved, and where each figure came from."""
    profile = gpu_profile(gpu)
    if weights_gib is not None:
        target, target_source = weights_gib, "given"
    else:
        estimate = (
            glm5_next_capacity.estimate_weights_gib_per_rank
            if isinstance(ckpt, Glm5NextCheckpoint)
            else estimate_weights_gib_per_rank
        )
        target = estimate(ckpt, tp, expert_bits)  # type: ignore[arg-type]
        target_source = f"estimated from the config, {expert_bits}-bit routed experts"
    if method in ("off", "ngram"):
        drafted, draft_source = 0.0, "none"
    elif draft_weights_gib is not None:
        drafted, draft_source = draft_weights_gib, "given"
    elif method == "mtp":
        assert isinstance(ckpt, HybridCheckpoint)
        drafted = estimate_mtp_weights_gib_per_rank(ckpt, tp, mtp_expert_bits)
        draft_source = f"estimated MTP module, {mtp_expert_bits}-bit experts"
    else:
        assert draft is not None
        drafted = draft.weights_gib_per_rank(tp)
        draft_source = f"estimated from the layers of {draft.name}"
    try:
        inputs = CapacityInputs(
            gpu_memory_gib=profile.memory_gib if gpu_memory_gib is None else gpu_memory_gib,
            gpu_memory_utilization=utilization,
            target_weights_gib=target,
            draft_weights_gib=drafted,
            profile_reserve_gib=profile_reserve_gib,
            max_model_len=ckpt.max_position_embeddings if max_model_len is None else max_model_len,
            max_num_batched_tokens=(
                SERVER_MAX_NUM_BATCHED_TOKENS[profile.name]
                if max_num_batched_tokens is None
                else max_num_batched_tokens
            ),
            # VllmConfig: async scheduling unless the V1 runner cannot overlap the drafter.
            async_scheduling=method != "ngram",
            context_lengths=context_lengths,
        )
    except ValidationError as err:
        problems = "; ".join(
            f"{CAPACITY_FLAGS.get(str(e['loc'][0]), e['loc'][0])} {e.get('input')!r}: "
            f"{e['msg'].lower()}"
            for e in err.errors()
        )
        raise UserError(problems) from None
    inputs.check_budget()
    return CapacityAssumptions(
        inputs=inputs,
        target_weights_source=target_source,
        draft_weights_source=draft_source,
        draft=draft if method == "dflash" else None,
    )


def make_plan(
    ckpt: HybridCheckpoint,
    *,
    gpu: str,
    tp: int,
    ks: list[int],
    kv_cache_dtype: KvCacheDtype = "auto",
    method: ChartMethod = "dflash",
    draft_model: str | None = None,
    draft: DraftProfile | None = None,
    engine: EngineName = "auto",
    prefix_match_unit: int | None = DEFAULT_PREFIX_MATCH_UNIT,
    schedule: str | None = None,
    **capacity: Any,
) -> DeploymentPlan:
    """Block sizes for each k, then vLLM's KV-cache plan for each (`capacity` takes the
    keyword arguments of `capacity_inputs`)."""
    profile = gpu_profile(gpu)
    validate_tp(ckpt, tp)
    if method == "off":
        if schedule is not None:
            raise UserError("--schedule needs speculative decoding: --method is off")
        ks = [0]
    ranges = None
    if schedule is not None:
        if len(ks) != 1:
            raise UserError(
                f"--schedule goes with one --k, the largest k it drafts (got {len(ks)} values: "
                f"{', '.join(map(str, ks))})"
            )
        try:
            ranges = parse_schedule(schedule, ks[0])
        except ScheduleError as err:
            raise UserError(f"--schedule: {err}") from None
    if method == "dflash" and draft is None:
        draft = default_dflash2_profile()
    engine_name, compute, capacity_of = select_engine(engine)
    assumptions = capacity_inputs(ckpt, gpu=gpu, tp=tp, method=method, draft=draft, **capacity)
    plans = [
        compute(ckpt, BlockSizeInputs(gpu=profile.name, tp=tp, kv_cache_dtype=kv_cache_dtype, k=k))
        for k in ks
    ]
    if prefix_match_unit:
        for plan in plans:
            check_prefix_match_unit(prefix_match_unit, plan, ckpt.indexer_compress_ratio)
    return DeploymentPlan(
        checkpoint=ckpt.source,
        gpu=profile.name,
        tp=tp,
        kv_cache_dtype=kv_cache_dtype,
        method=method,
        engine=engine_name,
        plans=plans,
        recommended_block_size={p.k: p.recommended_block_size for p in plans},
        capacity_assumptions=assumptions,
        capacity={
            p.k: capacity_of(
                ckpt, p, method=method, draft=assumptions.draft, inputs=assumptions.inputs
            )
            for p in plans
        },
        prefix_match_unit=prefix_match_unit or None,
        draft_model=(draft_model or DEFAULT_DRAFT_MODEL) if method == "dflash" else None,
        vllm_args={
            p.k: vllm_args(p, method, draft_model, prefix_match_unit, ranges) for p in plans
        },
        schedule=None if ranges is None else list(ranges),
    )
