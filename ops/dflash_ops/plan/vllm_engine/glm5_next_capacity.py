"""GLM-5.3-Flash's KV capacity from vLLM 0.33.0's own KV-cache planning, on CPU.

The engine's `VllmConfig` (the checkpoint config, `Glm5NextModelConfig`'s hook as on the GPU, the
block size aligned over the real attention backends), every layer's KV spec built as the layer's
`get_kv_cache_spec` builds it (the layers need GPU kernels to be built: `MLAAttention`,
`Glm5NextIndexerCache`, `Glm5NextTailCache`, `Glm5NextLinearAttention`, the draft's `Attention`)
and customized by its real backend, then vLLM's grouping, sizing, startup check and logged
capacity (`vllm_engine.kv_capacity.capacity_of_groups`).
"""

from __future__ import annotations

from typing import Any

from dflash_ops.plan.draft import DraftProfile
from dflash_ops.plan.glm5_next import Glm5NextBlockSizePlan, Glm5NextCheckpoint
from dflash_ops.plan.glm5_next_capacity import indexer_entry_bytes, layer_inventory, uses_flashkda
from dflash_ops.plan.kv_capacity import GROUP_OF, CapacityInputs, KvCapacity
from dflash_ops.plan.model import BlockSizeInputs
from dflash_ops.plan.vllm_engine.glm5_next import (
    attention_backends,
    build_vllm_config,
    glm_modules,
)
from dflash_ops.plan.vllm_engine.kv_capacity import (
    _capacity_api,
    capacity_of_groups,
    draft_spec,
    resolved_groups,
    run_with,
)
from dflash_ops.plan.vllm_engine.runtime import kv_torch_dtype

# Glm5NextIndexerCache and FlashKDA, as `glm5_next_capacity` reads them from vLLM's source.
FLASHKDA_CHECKPOINT_ALIGNMENT = 16


def capacity_config(
    ckpt: Glm5NextCheckpoint, plan: Glm5NextBlockSizePlan, inputs: CapacityInputs
) -> tuple[Any, list[Any]]:
    """The engine's VllmConfig with this block size, lengths and scheduling, and its layers'
    attention backends."""
    g = glm_modules()
    vllm_config = build_vllm_config(
        ckpt,
        BlockSizeInputs(gpu=plan.gpu, tp=plan.tp, kv_cache_dtype=plan.kv_cache_dtype, k=plan.k),
    )
    run_with(vllm_config, plan.recommended_block_size, inputs)
    _, backends, aligner = attention_backends(vllm_config, ckpt, plan.gpu, plan.sparse_mla_backend)
    with g["set_current_vllm_config"](vllm_config):
        aligner.update_block_size_for_backend(vllm_config)
    assert vllm_config.cache_config.block_size == plan.recommended_block_size
    return vllm_config, backends


def topk_buffer_width(ckpt: Glm5NextCheckpoint) -> int:
    """`get_sparse_topk_buffer_width`: the top-k, the pool tail, 128-aligned."""
    assert ckpt.index_topk is not None
    return -(-(ckpt.index_topk + ckpt.index_kpool - 1) // 128) * 128


def layer_specs(
    vllm_config: Any,
    backends: list[Any],
    ckpt: Glm5NextCheckpoint,
    plan: Glm5NextBlockSizePlan,
    draft: DraftProfile | None,
) -> dict[str, Any]:
    g = glm_modules()
    api = _capacity_api()
    torch = g["torch"]
    from vllm.v1.kv_cache_interface import CircularBufferSpec, SparseCacheRole

    mla_backend, indexer_backend, tail_backend = backends
    model_config = vllm_config.model_config
    cache_config = vllm_config.cache_config
    block = cache_config.block_size
    cache_dtype = cache_config.cache_dtype
    kv_dtype = model_config.dtype if cache_dtype == "auto" else kv_torch_dtype(cache_dtype)
    model_cls = g["Glm5NextForPlanning"]

    def kda() -> Any:
        # MambaBase.get_kv_cache_spec, then Glm5NextLinearAttention's prefill checkpoint.
        alignment = FLASHKDA_CHECKPOINT_ALIGNMENT if uses_flashkda(ckpt, plan.gpu) else None
        return g["MambaSpec"](
            shapes=model_cls.get_mamba_state_shape_from_config(vllm_config),
            dtypes=model_cls.get_mamba_state_dtype_from_config(vllm_config),
            block_size=cache_config.mamba_block_size,
            page_size_padded=cache_config.mamba_page_size_padded,
            mamba_type=api.MambaAttentionBackendEnum.GDN_ATTN,
            tp_replicated=False,
            mamba_cache_mode=cache_config.mamba_cache_mode,
            num_speculative_blocks=vllm_config.num_speculative_tokens,
            num_prefill_checkpoint_blocks=int(alignment is not None),
            prefill_checkpoint_alignment=alignment,
        )

    def mla() -> Any:
        # MLAAttention.get_kv_cache_spec for a layer with an indexer.
        spec = g["MLAAttentionSpec"](
            block_size=block,
            num_kv_heads=1,
            max_tp_shards=1,
            head_size=ckpt.kv_lora_rank + ckpt.qk_rope_head_dim,
            dtype=kv_dtype,
            cache_dtype_str=cache_dtype,
            kv_quant_mode=g["get_kv_quant_mode"](cache_dtype),
            topk_buffer_width=topk_buffer_width(ckpt) if ckpt.sparse else None,
            is_index_group_leader=ckpt.sparse,
        )
        return api.customize_attention_spec(mla_backend, spec)

    def indexer() -> Any:
        # DeepseekV32IndexerCache.get_kv_cache_spec with Glm5NextIndexerCache's pooling.
        spec = g["MLAAttentionSpec"](
            block_size=block,
            num_kv_heads=1,
            max_tp_shards=1,
            head_size=indexer_entry_bytes(ckpt),
            dtype=torch.uint8,
            cache_role=SparseCacheRole.INDEXER,
            tokens_per_state=ckpt.index_kpool,
        )
        return api.customize_attention_spec(indexer_backend, spec)

    def tail() -> Any:
        # Glm5NextTailCache.get_kv_cache_spec.
        spec = CircularBufferSpec(
            block_size=plan.tail_ring,
            num_kv_heads=2,
            head_size=ckpt.index_head_dim,
            head_size_v=0,
            dtype=torch.bfloat16,
            dcp_sharded=False,
        )
        return api.customize_attention_spec(tail_backend, spec)

    # The draft's cache dtype: `Glm5NextModelConfig` keeps it at auto when it turns the
    # target's to fp8.
    speculative = vllm_config.speculative_config
    draft_cache_dtype = (
        speculative.kv_cache_dtype
        if speculative is not None and speculative.kv_cache_dtype is not None
        else cache_dtype
    )
    draft_dtype = (
        model_config.dtype if draft_cache_dtype == "auto" else kv_torch_dtype(draft_cache_dtype)
    )
    build = {"kda": kda, "mla": mla, "indexer": indexer, "tail": tail}
    specs: dict[str, Any] = {}
    vllm_config.compilation_config.static_forward_context.clear()
    for layer in layer_inventory(ckpt, draft):
        if layer.kind in build:
            specs[layer.name] = build[layer.kind]()
        else:
            assert draft is not None
            specs[layer.name] = draft_spec(
                layer.kind,
                draft,
                plan.tp,
                block,
                draft_dtype,
                g["get_kv_quant_mode"](draft_cache_dtype),
            )
    return specs


def kv_cache_groups(
    ckpt: Glm5NextCheckpoint,
    plan: Glm5NextBlockSizePlan,
    *,
    draft: DraftProfile | None,
    inputs: CapacityInputs,
) -> tuple[Any, dict[str, Any], list[Any]]:
    """The engine's VllmConfig, every layer's KV spec and vLLM's KV-cache groups for them, after
    the engine core's layout resolution."""
    vllm_config, backends = capacity_config(ckpt, plan, inputs)
    specs = layer_specs(vllm_config, backends, ckpt, plan, draft)
    return vllm_config, specs, resolved_groups(vllm_config, specs, backends)


def kv_capacity(
    ckpt: Glm5NextCheckpoint,
    plan: Glm5NextBlockSizePlan,
    *,
    draft: DraftProfile | None,
    inputs: CapacityInputs,
) -> KvCapacity:
    inputs.check_budget()
    vllm_config, specs, groups = kv_cache_groups(ckpt, plan, draft=draft, inputs=inputs)
    kind_of = {layer.name: GROUP_OF[layer.kind] for layer in layer_inventory(ckpt, draft)}
    return capacity_of_groups(
        vllm_config, specs, groups, kind_of, plan.k, plan.recommended_block_size, inputs
    )
