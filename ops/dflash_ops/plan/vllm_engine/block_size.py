"""The block size vLLM 0.33.0 settles on, from its own alignment code."""

from __future__ import annotations

from math import lcm

from dflash_ops.plan.checkpoint import HybridCheckpoint
from dflash_ops.plan.gpus import gpu_profile
from dflash_ops.plan.model import BlockSizeInputs, BlockSizePlan
from dflash_ops.plan.vllm_engine.runtime import (
    build_vllm_config,
    kv_torch_dtype,
    prefill_checkpoint_alignment,
    vllm_modules,
)


def plan_block_size(ckpt: HybridCheckpoint, inputs: BlockSizeInputs) -> BlockSizePlan:
    v = vllm_modules()
    gpu = gpu_profile(inputs.gpu)
    vllm_config = build_vllm_config(ckpt, inputs)
    cache_config = vllm_config.cache_config
    cache_config.block_size = v["CacheConfig"].DEFAULT_BLOCK_SIZE
    cache_config.user_specified_block_size = False

    with prefill_checkpoint_alignment(gpu.prefill_checkpoint_alignment):
        v["PlanningPlatform"].update_block_size_for_backend(vllm_config)
    automatic = cache_config.block_size

    model_config = vllm_config.model_config
    kv_dtype = (
        model_config.dtype
        if cache_config.cache_dtype == "auto"
        else kv_torch_dtype(cache_config.cache_dtype)
    )
    attention_page = (
        v["backends"][0]
        .customize_spec(
            v["FullAttentionSpec"](
                block_size=1,
                num_kv_heads=model_config.get_num_kv_heads(vllm_config.parallel_config),
                head_size=model_config.get_head_size(),
                dtype=kv_dtype,
                kv_quant_mode=v["get_kv_quant_mode"](cache_config.cache_dtype),
            )
        )
        .page_size_bytes
    )
    multiple_of = v["MultipleOf"]
    smallest_kernel_block = min(
        s.base if isinstance(s, multiple_of) else s
        for s in v["backends"][0].get_supported_kernel_block_sizes()
    )
    alignment = lcm(
        max(smallest_kernel_block, v["CacheConfig"].DEFAULT_BLOCK_SIZE),
        gpu.prefill_checkpoint_alignment or 1,
    )
    return BlockSizePlan.from_terms(
        inputs,
        attention_page=attention_page,
        gdn_state=v["gdn_spec"](vllm_config).page_size_bytes,
        ple_state=v["ple_spec"](vllm_config).page_size_bytes,
        kernel_alignment=alignment,
        automatic_block_size=automatic,
        compress_ratio=model_config.hf_text_config.indexer_compress_ratio,
        engine="vllm",
    )
