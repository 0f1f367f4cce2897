"""KV capacity from vLLM 0.33.0's own KV-cache planning, over every layer's KV spec."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from functools import cache
from types import SimpleNamespace
from typing import Any

from dflash_ops.plan.checkpoint import HybridCheckpoint
from dflash_ops.plan.draft import DraftProfile
from dflash_ops.plan.gpus import gpu_profile
from dflash_ops.plan.kv_capacity import (
    GIB,
    GROUP_OF,
    CapacityInputs,
    KvCapacity,
    layer_inventory,
    requests_that_fit,
    start_error,
)
from dflash_ops.plan.model import BlockSizeInputs, BlockSizePlan
from dflash_ops.plan.vllm_engine.runtime import (
    build_vllm_config,
    kv_torch_dtype,
    prefill_checkpoint_alignment,
    vllm_modules,
)
from dflash_ops.vocabulary import ChartMethod

# vLLM 0.33.0 names the capacity engine uses, as module:attribute. Loaded untyped: mypy runs
# beside the CPU engine's vLLM, which lacks some (this code only runs where vllm_available()).
_CAPACITY_NAMES = {
    "set_current_vllm_config": "vllm.config.vllm:set_current_vllm_config",
    "cdiv": "vllm.utils.math_utils:cdiv",
    "largest_kernel_block_within": (
        "vllm.model_executor.layers.attention.attention:_largest_kernel_block_within"
    ),
    "get_mamba_prefill_checkpoint_grid": (
        "vllm.model_executor.layers.mamba.abstract:get_mamba_prefill_checkpoint_grid"
    ),
    "QSACompressedKeyCache": "vllm.models.qwen4_exp.common.qsa_cache:QSACompressedKeyCache",
    "QSAKeyStateCache": "vllm.models.qwen4_exp.common.qsa_cache:QSAKeyStateCache",
    "FlashAttentionBackend": "vllm.v1.attention.backends.flash_attn:FlashAttentionBackend",
    "MambaAttentionBackendEnum": "vllm.v1.attention.backends.registry:MambaAttentionBackendEnum",
    "get_supported_kv_cache_layouts": (
        "vllm.v1.attention.backends.utils:get_supported_kv_cache_layouts"
    ),
    "resolve_kv_cache_layout": "vllm.v1.attention.backends.utils:resolve_kv_cache_layout",
    "get_kv_cache_config_builder": (
        "vllm.v1.core.kv_cache_config_builder:get_kv_cache_config_builder"
    ),
    "estimate_max_model_len_from_groups": (
        "vllm.v1.core.kv_cache_planning:_estimate_max_model_len_from_groups"
    ),
    "pool_bytes_per_block": "vllm.v1.core.kv_cache_planning:_pool_bytes_per_block",
    "get_global_kv_cache_groups": "vllm.v1.core.kv_cache_planning:get_global_kv_cache_groups",
    "get_kv_cache_configs": "vllm.v1.core.kv_cache_planning:get_kv_cache_configs",
    "generate_scheduler_kv_cache_config": (
        "vllm.v1.core.kv_cache_utils:generate_scheduler_kv_cache_config"
    ),
    "get_kv_cache_capacity": "vllm.v1.core.kv_cache_utils:get_kv_cache_capacity",
    "FullAttentionSpec": "vllm.v1.kv_cache_interface:FullAttentionSpec",
    "SlidingWindowSpec": "vllm.v1.kv_cache_interface:SlidingWindowSpec",
    "customize_attention_spec": "vllm.v1.worker.utils:customize_attention_spec",
}


@cache
def _capacity_api() -> SimpleNamespace:
    vllm_modules()  # first: it picks the platform the imports below see
    names = {}
    for name, target in _CAPACITY_NAMES.items():
        module, attribute = target.split(":")
        names[name] = getattr(importlib.import_module(module), attribute)
    return SimpleNamespace(**names)


def _capacity_config(plan: BlockSizePlan, ckpt: HybridCheckpoint, inputs: CapacityInputs) -> Any:
    """The VllmConfig of a running engine with this block size, lengths and scheduling."""
    v = vllm_modules()
    gpu = gpu_profile(plan.gpu)
    vllm_config = build_vllm_config(
        ckpt,
        BlockSizeInputs(gpu=plan.gpu, tp=plan.tp, kv_cache_dtype=plan.kv_cache_dtype, k=plan.k),
    )
    run_with(vllm_config, plan.recommended_block_size, inputs)
    with prefill_checkpoint_alignment(gpu.prefill_checkpoint_alignment):
        v["PlanningPlatform"].update_block_size_for_backend(vllm_config)
    assert vllm_config.cache_config.block_size == plan.recommended_block_size
    return vllm_config


def run_with(vllm_config: Any, block: int, inputs: CapacityInputs) -> None:
    """A config as the engine runs it: this block size, lengths and scheduling."""
    vllm_config.cache_config.block_size = block
    vllm_config.cache_config.user_specified_block_size = True
    vllm_config.model_config.max_model_len = inputs.max_model_len
    vllm_config.scheduler_config.max_num_batched_tokens = inputs.max_num_batched_tokens
    # What VllmConfig resolves for the real method (the n-gram stand-in turns it off).
    vllm_config.scheduler_config.async_scheduling = inputs.async_scheduling


def _layer_specs(
    vllm_config: Any,
    ckpt: HybridCheckpoint,
    plan: BlockSizePlan,
    method: ChartMethod,
    draft: DraftProfile | None,
) -> dict[str, Any]:
    """Each layer's KV spec as the model runner collects it (`get_kv_cache_spec`, then
    `customize_attention_spec` with the layer's backend). The QSA side caches are vLLM's own
    modules; the GPU-only layers' specs are built the way their `get_kv_cache_spec` builds them."""
    from dataclasses import replace

    v = vllm_modules()
    api = _capacity_api()

    torch = v["torch"]
    qsa_backend, state_backend = v["backends"]
    model_config = vllm_config.model_config
    cache_config = vllm_config.cache_config
    hf = model_config.hf_text_config
    kv_dtype = (
        model_config.dtype
        if cache_config.cache_dtype == "auto"
        else kv_torch_dtype(cache_config.cache_dtype)
    )
    quant_mode = v["get_kv_quant_mode"](cache_config.cache_dtype)
    block = cache_config.block_size
    gpu = gpu_profile(plan.gpu)

    def mamba(spec: Any, mamba_type: Any, replicated: bool) -> Any:
        # MambaBase.get_kv_cache_spec, and the prefill checkpoint GDN/PLE add where every
        # Mamba layer can export one.
        spec = replace(
            spec,
            block_size=cache_config.mamba_block_size,
            page_size_padded=cache_config.mamba_page_size_padded,
            mamba_type=mamba_type,
            tp_replicated=replicated,
            mamba_cache_mode=cache_config.mamba_cache_mode,
            num_speculative_blocks=vllm_config.num_speculative_tokens,
        )
        if gpu.prefill_checkpoint_alignment is None:
            return spec
        return replace(
            spec,
            num_prefill_checkpoint_blocks=1,
            prefill_checkpoint_alignment=api.get_mamba_prefill_checkpoint_grid(vllm_config),
        )

    specs: dict[str, Any] = {}
    vllm_config.compilation_config.static_forward_context.clear()
    with prefill_checkpoint_alignment(gpu.prefill_checkpoint_alignment):
        for layer in layer_inventory(ckpt, method, draft):
            if layer.kind == "attention":
                spec = api.FullAttentionSpec(
                    block_size=block,
                    num_kv_heads=model_config.get_num_kv_heads(vllm_config.parallel_config),
                    head_size=hf.head_dim,
                    head_size_v=hf.head_dim,
                    dtype=kv_dtype,
                    kv_quant_mode=quant_mode,
                )
                specs[layer.name] = api.customize_attention_spec(qsa_backend, spec)
            elif layer.kind == "ring":
                cache = api.QSAKeyStateCache(
                    head_size=hf.indexer_head_dim,
                    dtype=torch.bfloat16,
                    cache_rope_positions=model_config.uses_mrope,
                    prefix=layer.name,
                    cache_config=cache_config,
                    compress_ratio=hf.indexer_compress_ratio,
                    vllm_config=vllm_config,
                )
                specs[layer.name] = api.customize_attention_spec(
                    state_backend, cache.get_kv_cache_spec(vllm_config)
                )
            elif layer.kind == "compressed":
                cache = api.QSACompressedKeyCache(
                    head_size=hf.indexer_head_dim,
                    dtype=torch.bfloat16,
                    compress_ratio=hf.indexer_compress_ratio,
                    prefix=layer.name,
                    cache_config=cache_config,
                    vllm_config=vllm_config,
                )
                specs[layer.name] = api.customize_attention_spec(
                    state_backend, cache.get_kv_cache_spec(vllm_config)
                )
            elif layer.kind == "gdn":
                specs[layer.name] = mamba(
                    v["gdn_spec"](vllm_config), api.MambaAttentionBackendEnum.GDN_ATTN, False
                )
            elif layer.kind == "ple":
                specs[layer.name] = mamba(
                    v["ple_spec"](vllm_config), api.MambaAttentionBackendEnum.SHORT_CONV, True
                )
            else:
                assert draft is not None
                specs[layer.name] = draft_spec(
                    layer.kind, draft, plan.tp, block, kv_dtype, quant_mode
                )
    return specs


def draft_spec(
    kind: str, draft: DraftProfile, tp: int, block: int, kv_dtype: Any, quant_mode: Any
) -> Any:
    """A DFlash draft layer's spec as its `Attention.get_kv_cache_spec` makes it."""
    from dataclasses import replace

    api = _capacity_api()
    heads = draft.num_kv_heads_per_rank(tp)
    if kind == "draft_full":
        spec = api.FullAttentionSpec(
            block_size=block,
            num_kv_heads=heads,
            head_size=draft.head_dim,
            head_size_v=draft.head_dim,
            dtype=kv_dtype,
            kv_quant_mode=quant_mode,
        )
    else:
        # Attention.get_kv_cache_spec for a sliding-window layer.
        per_token = api.FlashAttentionBackend.customize_spec(
            api.SlidingWindowSpec(
                block_size=1,
                num_kv_heads=heads,
                head_size=draft.head_dim,
                head_size_v=draft.head_dim,
                dtype=kv_dtype,
                kv_quant_mode=quant_mode,
                sliding_window=draft.sliding_window,
            )
        )
        spec = api.SlidingWindowSpec(
            block_size=api.largest_kernel_block_within(
                api.FlashAttentionBackend,
                per_token.real_page_size_bytes,
                per_token.real_page_size_bytes * block,
                block,
                per_token,
            ),
            num_kv_heads=heads,
            head_size=draft.head_dim,
            head_size_v=draft.head_dim,
            dtype=kv_dtype,
            kv_quant_mode=quant_mode,
            sliding_window=draft.sliding_window,
        )
    spec = api.customize_attention_spec(api.FlashAttentionBackend, spec)
    return replace(spec, is_draft=True)


def kv_cache_groups(
    ckpt: HybridCheckpoint,
    plan: BlockSizePlan,
    *,
    method: ChartMethod,
    draft: DraftProfile | None,
    inputs: CapacityInputs,
) -> tuple[Any, dict[str, Any], list[Any]]:
    """The engine's VllmConfig, every layer's KV spec and vLLM's KV-cache groups for them, after
    the engine core's layout resolution (also what the prefix-cache tests drive vLLM's
    KVCacheManager with)."""
    vllm_config = _capacity_config(plan, ckpt, inputs)
    specs = _layer_specs(vllm_config, ckpt, plan, method, draft)
    return vllm_config, specs, resolved_groups(vllm_config, specs, vllm_modules()["backends"])


def resolved_groups(vllm_config: Any, specs: dict[str, Any], backends: list[Any]) -> list[Any]:
    """The engine core's KV-cache layout resolution over the model's attention backends and the
    draft's (FlashAttention), then vLLM's grouping of these layer specs."""
    api = _capacity_api()
    every = [*backends, api.FlashAttentionBackend]
    layouts = [layout.name for layout in api.get_supported_kv_cache_layouts(every)]
    with api.set_current_vllm_config(vllm_config):
        api.resolve_kv_cache_layout(vllm_config, [layouts], list(specs.values()))
        return list(api.get_global_kv_cache_groups(vllm_config, [specs]))


def kv_capacity(
    ckpt: HybridCheckpoint,
    plan: BlockSizePlan,
    *,
    method: ChartMethod,
    draft: DraftProfile | None,
    inputs: CapacityInputs,
) -> KvCapacity:
    """vLLM 0.33.0's KV-cache plan on one rank: the engine core's layout resolution, grouping
    (`get_global_kv_cache_groups`), sizing and startup check (`get_kv_cache_configs`), and the
    logged capacity (`get_kv_cache_capacity`) for these layer specs and this memory budget."""
    inputs.check_budget()
    vllm_config, specs, groups = kv_cache_groups(
        ckpt, plan, method=method, draft=draft, inputs=inputs
    )
    kind_of = {layer.name: GROUP_OF[layer.kind] for layer in layer_inventory(ckpt, method, draft)}
    return capacity_of_groups(
        vllm_config, specs, groups, kind_of, plan.k, plan.recommended_block_size, inputs
    )


def capacity_of_groups(
    vllm_config: Any,
    specs: dict[str, Any],
    groups: list[Any],
    kind_of: Mapping[str, str],
    k: int,
    block: int,
    inputs: CapacityInputs,
) -> KvCapacity:
    """Sizing and startup check (`get_kv_cache_configs`) and the logged capacity
    (`get_kv_cache_capacity`) of these groups in this budget; `kind_of` names each layer's
    group kind."""
    api = _capacity_api()
    budget = inputs.budget_bytes
    with api.set_current_vllm_config(vllm_config):
        bytes_per_block = api.pool_bytes_per_block(vllm_config, groups)
        error = None
        try:
            (config,) = api.get_kv_cache_configs(vllm_config, [specs], [budget], groups)
        except ValueError:
            builder = api.get_kv_cache_config_builder(vllm_config)
            config = builder.get_kv_cache_config_from_groups(
                vllm_config, groups, budget // bytes_per_block
            )
            max_fit = api.estimate_max_model_len_from_groups(
                builder, vllm_config, groups, budget - bytes_per_block
            )
            error = max_fit
        scheduler_config = api.generate_scheduler_kv_cache_config([config])
        tokens, concurrency = api.get_kv_cache_capacity(vllm_config, scheduler_config)

        def per_request(length: int) -> dict[str, int]:
            saved = vllm_config.model_config.max_model_len
            vllm_config.model_config.max_model_len = length
            try:
                blocks = {"attention": 0, "ring": 0, "mamba": 0, "draft": 0}
                for group in scheduler_config.kv_cache_groups:
                    spec = group.kv_cache_spec
                    blocks[kind_of[group.layer_names[0]]] += api.cdiv(
                        spec.max_memory_usage_bytes(vllm_config), spec.page_size_bytes
                    )
                return blocks
            finally:
                vllm_config.model_config.max_model_len = saved

        blocks = per_request(inputs.max_model_len)
        requests = {
            length: requests_that_fit(config.num_blocks, sum(per_request(length).values()))
            for length in inputs.context_lengths
            if length <= inputs.max_model_len
        }
    counts = {"attention": 0, "ring": 0, "mamba": 0, "draft": 0}
    for group in groups:
        counts[kind_of[group.layer_names[0]]] += 1
    return KvCapacity(
        k=k,
        block_size=block,
        kv_budget_gib_per_rank=round(budget / GIB, 2),
        bytes_per_block=bytes_per_block,
        num_blocks=config.num_blocks,
        groups=counts,
        blocks_per_request=blocks,
        kv_cache_tokens=tokens,
        max_concurrency=concurrency,
        requests_at=requests,
        mamba_state_bytes_per_request=blocks["mamba"] * bytes_per_block,
        start_error=(
            None
            if error is None
            else start_error(inputs, bytes_per_block, sum(blocks.values()), error)
        ),
        engine="vllm",
    )
