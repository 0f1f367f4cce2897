"""A closed-form model of vLLM 0.33.0's hybrid block-size alignment for Qwen4Exp.

It reproduces, without importing vLLM, what `Platform.update_block_size_for_backend` computes
for this model family (`_align_hybrid_block_size` with the Qwen4Exp Mamba specs), so the CLI
works on a laptop. `tests/ops/plan/test_engines_agree.py` holds it to the vLLM engine.
"""

from __future__ import annotations

from math import lcm

from dflash_ops.plan.checkpoint import HybridCheckpoint
from dflash_ops.plan.gpus import QSA_KERNEL_BLOCK, gpu_profile
from dflash_ops.plan.model import BlockSizeInputs, BlockSizePlan

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1}
DEFAULT_BLOCK_SIZE = 16  # vllm.config.cache.CacheConfig.DEFAULT_BLOCK_SIZE


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def attention_page_bytes(ckpt: HybridCheckpoint, tp: int, kv_cache_dtype: str) -> int:
    # ModelConfig.get_num_kv_heads: KV heads are split over TP ranks, replicated when fewer.
    kv_heads = max(1, ckpt.num_key_value_heads // tp)
    dtype = ckpt.dtype if kv_cache_dtype == "auto" else kv_cache_dtype
    return 2 * kv_heads * ckpt.head_dim * DTYPE_BYTES[dtype]


def gdn_state_bytes(ckpt: HybridCheckpoint, tp: int, k: int) -> int:
    # MambaStateShapeCalculator.gated_delta_net_state_shape, conv in the model dtype and the
    # recurrent state in mamba_ssm_dtype (Qwen3_5ForConditionalGenerationConfig).
    conv_dim = (
        ckpt.linear_key_head_dim * ckpt.linear_num_key_heads * 2
        + ckpt.linear_value_head_dim * ckpt.linear_num_value_heads
    )
    conv = (conv_dim // tp) * (ckpt.linear_conv_kernel_dim - 1 + k) * DTYPE_BYTES[ckpt.dtype]
    recurrent = (
        (ckpt.linear_num_value_heads // tp)
        * ckpt.linear_value_head_dim
        * ckpt.linear_key_head_dim
        * DTYPE_BYTES[ckpt.mamba_ssm_dtype]
    )
    return conv + recurrent


def ple_state_bytes(ckpt: HybridCheckpoint, k: int) -> int:
    # The PLE short conv is replicated (tp_world_size=1) over hc_count * hidden channels with a
    # dilated window of (kernel - 1) * ngram_size rows plus one per speculative token.
    if not ckpt.ple_layer_ids:
        return 0
    rows = (ckpt.ple_conv_kernel_size - 1) * ckpt.ngram_size + k
    return ckpt.hidden_size * ckpt.hc_count * rows * DTYPE_BYTES[ckpt.dtype]


def plan_block_size(ckpt: HybridCheckpoint, inputs: BlockSizeInputs) -> BlockSizePlan:
    gpu = gpu_profile(inputs.gpu)
    page = attention_page_bytes(ckpt, inputs.tp, inputs.kv_cache_dtype)
    gdn = gdn_state_bytes(ckpt, inputs.tp, inputs.k)
    ple = ple_state_bytes(ckpt, inputs.k)
    mamba = max(gdn, ple)
    alignment = max(QSA_KERNEL_BLOCK, DEFAULT_BLOCK_SIZE)
    alignment = lcm(alignment, gpu.prefill_checkpoint_alignment or 1)
    block = alignment * _cdiv(mamba, alignment * page)
    block = QSA_KERNEL_BLOCK * _cdiv(block, QSA_KERNEL_BLOCK)
    return BlockSizePlan.from_terms(
        inputs,
        attention_page=page,
        gdn_state=gdn,
        ple_state=ple,
        kernel_alignment=alignment,
        automatic_block_size=max(block, DEFAULT_BLOCK_SIZE),
        compress_ratio=ckpt.indexer_compress_ratio,
        engine="closed-form",
    )
