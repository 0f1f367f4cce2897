"""GLM-5.3-Flash: vLLM 0.33.0's own code and the closed form agree on every supported
configuration, whichever of vLLM's sparse MLA backends the GPU runs, and the GPUs the planner
refuses are the ones vLLM's sparse MLA backends refuse."""

from __future__ import annotations

import itertools

import pytest
from dflash_ops.plan import glm5_next
from dflash_ops.plan.glm5_next import load_glm5_next, plan_block_size
from dflash_ops.plan.gpus import GPUS
from dflash_ops.plan.model import BlockSizeInputs

pytestmark = pytest.mark.vllm033

CKPT = load_glm5_next()
GRID = list(itertools.product(glm5_next.SPARSE_MLA_GPUS, (1, 2, 4, 8), ("auto", "bfloat16", "fp8")))

# vLLM 0.33.0's sparse MLA backends for NVIDIA GPUs (AttentionBackendEnum): the ones the CUDA
# platform lists for MLA with a sparse indexer. FLASH_ATTN_MLA_SPARSE needs the CUDA
# FlashAttention extension to import; its supports_compute_capability is SM90 only.
SPARSE_BACKENDS = (
    "FLASHINFER_MLA_SPARSE",
    "FLASHINFER_MLA_SPARSE_SM90",
    "FLASHINFER_MLA_SPARSE_SM120",
    "FLASHMLA_SPARSE",
    "FLASH_ATTN_MLA_SPARSE_FA4",
)


@pytest.mark.parametrize(("gpu", "tp", "kv"), GRID)
def test_engines_agree_for_every_k(gpu: str, tp: int, kv: str) -> None:
    from dflash_ops.plan.vllm_engine import glm5_next as vllm_glm5_next

    for k in range(16):
        inputs = BlockSizeInputs(gpu=gpu, tp=tp, kv_cache_dtype=kv, k=k)  # type: ignore[arg-type]
        exact = vllm_glm5_next.plan_block_size(CKPT, inputs)
        assert exact.engine == "vllm"
        assert exact.comparable() == plan_block_size(CKPT, inputs).comparable(), (gpu, tp, kv, k)


def capability(gpu: str) -> object:
    from vllm.platforms.interface import DeviceCapability

    major, minor = GPUS[gpu].compute_capability
    return DeviceCapability(major, minor)


def backend_class(name: str) -> type:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return AttentionBackendEnum[name].get_class()


def test_the_block_does_not_depend_on_which_sparse_backend_the_gpu_runs() -> None:
    from dflash_ops.plan.vllm_engine import glm5_next as vllm_glm5_next

    for gpu, tp, k in itertools.product(glm5_next.SPARSE_MLA_GPUS, (1, 8), (0, 15)):
        inputs = BlockSizeInputs(gpu=gpu, tp=tp, k=k)
        usable = [
            name
            for name in SPARSE_BACKENDS
            if backend_class(name).supports_compute_capability(capability(gpu))
        ]
        assert usable, gpu
        blocks = {
            vllm_glm5_next.plan_block_size(CKPT, inputs, name).automatic_block_size
            for name in usable
        }
        assert blocks == {plan_block_size(CKPT, inputs).automatic_block_size}, (gpu, tp, k, usable)


def test_the_named_backends_run_on_their_gpu_with_the_kernel_block_the_closed_form_takes() -> None:
    for gpu, kv, heads in itertools.product(
        glm5_next.SPARSE_MLA_GPUS, ("bfloat16", "fp8"), (8, 64)
    ):
        named = glm5_next.sparse_mla_backend(gpu, kv, heads)
        cls = backend_class(named.name)
        assert cls.is_sparse() and cls.supports_compute_capability(capability(gpu)), named
        sizes = [getattr(s, "base", s) for s in cls.get_supported_kernel_block_sizes()]
        assert min(sizes) == named.kernel_block, (named, sizes)


def test_no_sparse_backend_runs_on_the_gpus_the_planner_refuses() -> None:
    refused = sorted(set(GPUS) - set(glm5_next.SPARSE_MLA_GPUS))
    assert refused == ["a100"]
    for gpu in refused:
        takers = [
            n
            for n in SPARSE_BACKENDS
            if backend_class(n).supports_compute_capability(capability(gpu))
        ]
        assert takers == [], (gpu, takers)


def test_the_b200_kv_cache_comes_from_vllms_own_hook() -> None:
    """fp8 on B200 is Glm5NextModelConfig's decision, run as on an SM100 GPU; H100 keeps bf16."""
    from dflash_ops.plan.vllm_engine import glm5_next as vllm_glm5_next

    b200 = vllm_glm5_next.build_vllm_config(CKPT, BlockSizeInputs(gpu="b200", tp=2, k=3))
    h100 = vllm_glm5_next.build_vllm_config(CKPT, BlockSizeInputs(gpu="h100", tp=2, k=3))
    assert b200.cache_config.cache_dtype == "fp8" and h100.cache_config.cache_dtype == "auto"
    assert b200.model_config.use_mla and b200.model_config.is_hybrid
    assert b200.cache_config.enable_prefix_caching and b200.cache_config.mamba_cache_mode == "align"
