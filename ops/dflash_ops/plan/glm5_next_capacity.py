"""GLM-5.3-Flash's KV cache as vLLM 0.33.0 plans it: the layers that own pages, the weights that
come before them, and the closed form of the plan.

Every MLA layer (`indexed_attention`) owns three caches: its latent vectors (`MLAAttentionSpec`,
one per token), the DSA indexer's keys (an `MLAAttentionSpec` of fp8 keys with their scales, one
per `index_kpool` tokens, on the same block table) and the indexer's tail ring (a
`CircularBufferSpec`: one block of `tail_ring` raw keys and gate scores per request). Every KDA
layer (`linear_attention`) owns a Mamba state; a DFlash draft adds its attention layers. vLLM
packs them block-outermost into groups (`_get_packed_kv_cache_groups`), as it does Qwen4Exp's;
the closed form is `kv_capacity_closed_form`'s packing over these pages, and
`tests/ops/plan/test_glm5_next_capacity_engines_agree.py` holds it to vLLM's own functions.
"""

from __future__ import annotations

from math import gcd
from typing import Any

from dflash_ops.plan.draft import DraftProfile, assumed_profile
from dflash_ops.plan.glm5_next import (
    DTYPE_BYTES,
    INDEXER_PAGE_ENTRIES,
    Glm5NextBlockSizePlan,
    Glm5NextCheckpoint,
    sparse_mla_backend,
)
from dflash_ops.plan.kv_capacity import GIB, CapacityInputs, KvCapacity, KvLayer, draft_layers
from dflash_ops.plan.kv_capacity_closed_form import Page, capacity_of_pages, cdiv, draft_page

# The indexer stores fp8 keys with one float32 scale per 128 values (`Indexer.quant_block_size`).
INDEXER_QUANT_BLOCK = 128
# FlashKDA (the KDA prefill kernel on SM90/SM100 for bf16, head_dim 128 and a bounded gate)
# exports a prefill checkpoint every 16 tokens (`kda_prefill_checkpoint_alignment`).
FLASHKDA_GPUS = ("h100", "h200", "b200")

# The DFlash2 draft of GLM-5.3-Flash, assumed as the Qwen one is: five sliding-window layers of
# window 2048 with the target's hidden size, 2 KV heads of 128. Pass --draft-config for the real
# one.
DEFAULT_GLM_DFLASH2_CONFIG: dict[str, Any] = {
    "_name_or_path": "GLM-5.3-Flash-DFlash2",
    "num_hidden_layers": 5,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "intermediate_size": 12288,
    "layer_types": ["sliding_attention"] * 5,
    "sliding_window": 2048,
    "dflash_config": {"target_layer_ids": [3, 11, 23, 35, 43]},
}


def default_glm_dflash2_profile() -> DraftProfile:
    return assumed_profile(DEFAULT_GLM_DFLASH2_CONFIG)


def layer_inventory(ckpt: Glm5NextCheckpoint, draft: DraftProfile | None) -> list[KvLayer]:
    """The layers the engine reports KV specs for, in the model's order, named as vLLM names
    them (`Glm5NextDecoderLayer`, `MultiHeadLatentAttentionWrapper`, `Indexer`)."""
    layers: list[KvLayer] = []
    kda = set(ckpt.kda_layer_ids)
    for i in range(ckpt.num_hidden_layers):
        prefix = f"model.layers.{i}.self_attn"
        if i in kda:
            layers.append(KvLayer(name=prefix, kind="kda"))
            continue
        layers.append(KvLayer(name=f"{prefix}.attn", kind="mla"))
        if ckpt.sparse:
            layers += [
                KvLayer(name=f"{prefix}.indexer.k_cache", kind="indexer"),
                KvLayer(name=f"{prefix}.indexer.tail_cache", kind="tail"),
            ]
    if draft is not None:
        layers += draft_layers(draft)
    return layers


def indexer_entry_bytes(ckpt: Glm5NextCheckpoint) -> int:
    """One pooled indexer key: fp8 values and a float32 scale per 128 (`Indexer.__init__`)."""
    return ckpt.index_head_dim + ckpt.index_head_dim // INDEXER_QUANT_BLOCK * 4


def uses_flashkda(ckpt: Glm5NextCheckpoint, gpu: str) -> bool:
    """`_resolve_kda_prefill_backend` with `kda_prefill_backend` auto."""
    return (
        gpu in FLASHKDA_GPUS
        and ckpt.linear_head_dim == 128
        and ckpt.dtype == "bfloat16"
        and ckpt.linear_lower_bound is not None
    )


def estimate_weights_gib_per_rank(ckpt: Glm5NextCheckpoint, tp: int, expert_bits: int) -> float:
    """The target's weights per rank: dense weights in bf16 split over TP, routed experts at
    `expert_bits` split over the expert-parallel ranks (the checkpoint's own size is what
    --weights-from measures)."""
    h = ckpt.hidden_size
    heads = ckpt.num_attention_heads
    q_in = ckpt.q_lora_rank or h
    latent = ckpt.kv_lora_rank + ckpt.qk_rope_head_dim
    mla = (
        (h * ckpt.q_lora_rank if ckpt.q_lora_rank else 0)
        + q_in * heads * (ckpt.qk_nope_head_dim + ckpt.qk_rope_head_dim)
        + h * latent
        + ckpt.kv_lora_rank * heads * (ckpt.qk_nope_head_dim + ckpt.v_head_dim)
        + heads * ckpt.v_head_dim * h
    )
    if ckpt.sparse:
        mla += q_in * ckpt.index_n_heads * ckpt.index_head_dim + h * (
            ckpt.index_head_dim + ckpt.index_n_heads
        )
    projection = ckpt.linear_num_heads * ckpt.linear_head_dim
    kda = 5 * h * projection  # q, k, v, the gate and the output
    sparse = sum(t == "sparse" for t in ckpt.mlp_layer_types)
    dense_mlp = (ckpt.num_hidden_layers - sparse) * 3 * h * ckpt.intermediate_size
    shared = sparse * ckpt.n_shared_experts * 3 * h * ckpt.moe_intermediate_size
    router = sparse * h * ckpt.n_routed_experts
    experts = sparse * ckpt.n_routed_experts * 3 * h * ckpt.moe_intermediate_size
    mla_layers = ckpt.num_hidden_layers - len(ckpt.kda_layer_ids)
    embeddings = (1 if ckpt.tie_word_embeddings else 2) * ckpt.vocab_size * h
    dense = (
        mla_layers * mla + len(ckpt.kda_layer_ids) * kda + dense_mlp + shared + router + embeddings
    )
    scales = 1.03 if expert_bits < 16 else 1.0  # group scales and zeros
    return (dense * 2 + experts * expert_bits / 8 * scales) / tp / GIB


def _pages(
    ckpt: Glm5NextCheckpoint,
    plan: Glm5NextBlockSizePlan,
    draft: DraftProfile | None,
    inputs: CapacityInputs,
) -> list[Page]:
    block = plan.recommended_block_size
    mla_page = block * plan.mla_page_bytes_per_token
    indexer_page = block // ckpt.index_kpool * indexer_entry_bytes(ckpt)
    tail_page = plan.tail_ring * 2 * ckpt.index_head_dim * DTYPE_BYTES["bfloat16"]
    checkpoint_blocks = int(uses_flashkda(ckpt, plan.gpu))
    # align mode: the running state, the one before and one per draft token, plus the
    # prefill checkpoint FlashKDA exports.
    kda_blocks = 2 + plan.k + checkpoint_blocks
    # A B200's automatic fp8 KV cache leaves the draft's in the model dtype
    # (`Glm5NextModelConfig` sets the speculative config's kv_cache_dtype to auto).
    draft_dtype = ckpt.dtype if plan.kv_cache_dtype == "auto" else plan.kv_cache_dtype

    def full(length: int) -> int:
        return cdiv(length, block)

    # Stride alignments: the sparse MLA backend's rows, and the indexer's largest kernel page
    # where a block holds several (`customize_attention_spec`).
    heads = ckpt.num_attention_heads // plan.tp
    backend = sparse_mla_backend(plan.gpu, plan.effective_kv_cache_dtype, heads)
    mla_stride = backend.stride_rows * plan.mla_page_bytes_per_token
    indexer_kernel = gcd(ckpt.index_kpool * max(INDEXER_PAGE_ENTRIES), block)
    indexer_stride = (
        1
        if indexer_kernel == block
        else indexer_kernel // ckpt.index_kpool * indexer_entry_bytes(ckpt)
    )

    pages: list[Page] = []
    for layer in layer_inventory(ckpt, draft):
        if layer.kind == "mla":
            page = Page(layer.name, layer.kind, ("full", block), mla_page, full, mla_stride)
        elif layer.kind == "indexer":
            page = Page(layer.name, layer.kind, ("full", block), indexer_page, full, indexer_stride)
        elif layer.kind == "tail":
            page = Page(layer.name, layer.kind, ("ring", plan.tail_ring), tail_page, lambda _: 1)
        elif layer.kind == "kda":
            key = ("mamba", False, plan.k, checkpoint_blocks)
            page = Page(layer.name, layer.kind, key, mla_page, lambda _: kda_blocks)
        else:
            assert draft is not None
            page = draft_page(layer, draft, plan.tp, block, DTYPE_BYTES[draft_dtype], inputs)
        pages.append(page)
    return pages


def kv_capacity(
    ckpt: Glm5NextCheckpoint,
    plan: Glm5NextBlockSizePlan,
    *,
    draft: DraftProfile | None,
    inputs: CapacityInputs,
) -> KvCapacity:
    inputs.check_budget()
    return capacity_of_pages(
        _pages(ckpt, plan, draft, inputs), plan.k, plan.recommended_block_size, inputs
    )
