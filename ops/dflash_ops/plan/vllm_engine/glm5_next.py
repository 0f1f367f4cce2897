"""The block size vLLM 0.33.0 settles on for GLM-5.3-Flash, from its own code on CPU.

A real `VllmConfig` from the checkpoint config, vLLM's own `Glm5NextModelConfig` hook (run as
on the GPU it names: fp8 KV on B200), and the platform's alignment over the real attention
backends of the model's layers: the sparse MLA backend the GPU picks, the DSA indexer's and its
tail ring's. What stands in: the model class (it needs GPU kernels; its KDA state shape and
dtype are vLLM's own calculators) and the CPU platform's MLA hook, which turns prefix caching
off where no GPU platform does.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from functools import cache
from math import lcm
from typing import Any

from dflash_ops.plan.glm5_next import (
    MLA_HYBRID_ALIGNMENT,
    Glm5NextBlockSizePlan,
    Glm5NextCheckpoint,
    sparse_mla_backend,
)
from dflash_ops.plan.model import BlockSizeInputs
from dflash_ops.plan.vllm_engine.runtime import (
    checkpoint_model_config,
    kv_torch_dtype,
    ngram_speculative_config,
    vllm_modules,
)

# Compute capability per GPU product, for vLLM's own hooks.
CAPABILITY_FAMILY = {"h100": 90, "h200": 90, "b200": 100}


@cache
def glm_modules() -> dict[str, Any]:
    v = vllm_modules()
    from torch import nn
    from vllm.config.vllm import set_current_vllm_config
    from vllm.model_executor.layers.mamba.mamba_utils import (
        MambaStateDtypeCalculator,
        MambaStateShapeCalculator,
    )
    from vllm.model_executor.models.config import (  # type: ignore[attr-defined]
        Glm5NextModelConfig,  # 0.33.0; the CPU build's 0.32.0 has none
    )
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backends.mla.indexer import Glm5NextIndexerBackend, KpoolTailBackend
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.kv_cache_interface import MambaSpec, MLAAttentionSpec, get_kv_quant_mode

    class Glm5NextForPlanning(nn.Module):
        """Registry entry with GLM-5.3-Flash's KDA state (`Glm5NextForCausalLM`'s classmethods,
        vLLM's calculators); never instantiated."""

        is_hybrid = True
        has_inner_state = True

        def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
            raise RuntimeError("Glm5NextForPlanning only answers spec queries")

        # What vLLM's registry asks of a text-generation model.
        def embed_input_ids(self, input_ids: Any) -> Any:
            raise NotImplementedError

        def forward(self, input_ids: Any, positions: Any) -> Any:
            raise NotImplementedError

        def compute_logits(self, hidden_states: Any) -> Any:
            raise NotImplementedError

        @classmethod
        def get_mamba_state_dtype_from_config(cls, vllm_config: Any) -> Any:
            cache_config = vllm_config.cache_config
            return MambaStateDtypeCalculator.kda_state_dtype(
                vllm_config.model_config.dtype,
                cache_config.mamba_cache_dtype,
                cache_config.mamba_ssm_cache_dtype,
            )

        @classmethod
        def get_mamba_state_shape_from_config(cls, vllm_config: Any) -> Any:
            hf = vllm_config.model_config.hf_text_config
            return MambaStateShapeCalculator.kda_state_shape(
                vllm_config.parallel_config.tensor_parallel_size,
                hf.linear_num_heads,
                hf.linear_head_dim,
                conv_kernel_size=hf.linear_conv_kernel_dim,
                num_spec=vllm_config.num_speculative_tokens,
            )

    return v | {
        "Glm5NextForPlanning": Glm5NextForPlanning,
        "Glm5NextModelConfig": Glm5NextModelConfig,
        "Platform": Platform,
        "AttentionBackendEnum": AttentionBackendEnum,
        "Glm5NextIndexerBackend": Glm5NextIndexerBackend,
        "KpoolTailBackend": KpoolTailBackend,
        "MambaSpec": MambaSpec,
        "MLAAttentionSpec": MLAAttentionSpec,
        "get_kv_quant_mode": get_kv_quant_mode,
        "set_current_vllm_config": set_current_vllm_config,
    }


@contextlib.contextmanager
def cpu_platform_hook_off() -> Iterator[None]:
    """The CPU platform's config hook turns prefix caching off for MLA models, which no GPU
    platform does (and with it the Mamba block size align mode needs)."""
    import vllm.platforms as platforms

    cpu_platform = type(platforms.current_platform)
    hook = cpu_platform.__dict__["check_and_update_config"]
    off: Any = classmethod(lambda cls, vllm_config: None)
    cpu_platform.check_and_update_config = off  # type: ignore[method-assign]
    try:
        yield
    finally:
        cpu_platform.check_and_update_config = hook  # type: ignore[method-assign]


@contextlib.contextmanager
def platform_as(gpu: str) -> Iterator[None]:
    """`current_platform` answering as the GPU for a model's config hook (the rest as the CPU
    platform)."""
    import vllm.platforms as platforms

    cpu = platforms.current_platform

    class AsTheGpu:
        def __getattr__(self, name: str) -> Any:
            return getattr(cpu, name)

        def is_cuda(self) -> bool:
            return True

        def is_device_capability_family(self, family: int) -> bool:
            return CAPABILITY_FAMILY[gpu] == family

    platforms.current_platform = AsTheGpu()  # type: ignore[assignment]
    try:
        yield
    finally:
        platforms.current_platform = cpu


def build_vllm_config(ckpt: Glm5NextCheckpoint, inputs: BlockSizeInputs) -> Any:
    g = glm_modules()
    model = copy.deepcopy(
        checkpoint_model_config(ckpt.source, ckpt.architecture, g["Glm5NextForPlanning"])
    )
    parallel = g["ParallelConfig"](tensor_parallel_size=inputs.tp, enable_expert_parallel=True)
    speculative = ngram_speculative_config(inputs.k, model, parallel)
    with cpu_platform_hook_off():
        vllm_config = g["VllmConfig"](
            model_config=model,
            cache_config=g["CacheConfig"](
                mamba_cache_mode="align", cache_dtype=inputs.kv_cache_dtype
            ),
            parallel_config=parallel,
            speculative_config=speculative,
        )
    with platform_as(inputs.gpu):
        g["Glm5NextModelConfig"].verify_and_update_config(vllm_config)
    return vllm_config


def attention_backends(
    vllm_config: Any, ckpt: Glm5NextCheckpoint, gpu: str, sparse_backend: str | None = None
) -> tuple[str, list[Any], Any]:
    """The sparse MLA backend's name, the attention backends of the model's layers (sparse MLA,
    the DSA indexer's, its tail ring's) and the platform that aligns blocks over them."""
    g = glm_modules()
    kv_dtype = vllm_config.cache_config.cache_dtype
    effective = ckpt.dtype if kv_dtype == "auto" else kv_dtype
    heads = vllm_config.model_config.get_num_attention_heads(vllm_config.parallel_config)
    name = sparse_backend or sparse_mla_backend(gpu, effective, heads).name
    backends = [
        g["AttentionBackendEnum"][name].get_class(),
        g["Glm5NextIndexerBackend"],
        g["KpoolTailBackend"],
    ]

    platform: Any = g["Platform"]

    class PlanningPlatform(platform):  # type: ignore[misc]
        @classmethod
        def _find_non_ssm_backends(cls, vllm_config: Any) -> list[Any]:
            return list(backends)

    return name, backends, PlanningPlatform


def plan_block_size(
    ckpt: Glm5NextCheckpoint, inputs: BlockSizeInputs, sparse_backend: str | None = None
) -> Glm5NextBlockSizePlan:
    """`sparse_backend` names another of vLLM's sparse MLA backends than the GPU's first."""
    g = glm_modules()
    vllm_config = build_vllm_config(ckpt, inputs)
    cache_config = vllm_config.cache_config
    kv_dtype = cache_config.cache_dtype
    effective = ckpt.dtype if kv_dtype == "auto" else kv_dtype
    name, backends, aligner = attention_backends(vllm_config, ckpt, inputs.gpu, sparse_backend)

    default = g["CacheConfig"].DEFAULT_BLOCK_SIZE
    cache_config.block_size = default
    cache_config.user_specified_block_size = False
    with g["set_current_vllm_config"](vllm_config):
        aligner.update_block_size_for_backend(vllm_config)
        # The alignment `_align_hybrid_block_size` rounds by: the block every backend takes,
        # the first backend's smallest kernel block, and 128 for hybrid MLA.
        common = aligner._preferred_block_size_for_backends(backends, default, vllm_config)
        first = min(getattr(s, "base", s) for s in backends[0].get_supported_kernel_block_sizes())
        grid = lcm(
            *(
                min(getattr(s, "base", s) for s in sizes)
                for b in backends
                if (sizes := b.get_supported_kernel_block_sizes())
            )
        )
    block = cache_config.block_size

    model = vllm_config.model_config
    page = g["MLAAttentionSpec"](
        block_size=1,
        num_kv_heads=model.get_num_kv_heads(vllm_config.parallel_config),
        head_size=model.get_head_size(),
        dtype=model.dtype if kv_dtype == "auto" else kv_torch_dtype(kv_dtype),
        cache_dtype_str=kv_dtype,
        kv_quant_mode=g["get_kv_quant_mode"](kv_dtype),
    ).page_size_bytes
    model_cls = g["Glm5NextForPlanning"]
    state = g["MambaSpec"](
        shapes=model_cls.get_mamba_state_shape_from_config(vllm_config),
        dtypes=model_cls.get_mamba_state_dtype_from_config(vllm_config),
        block_size=-1,
    ).page_size_bytes
    return Glm5NextBlockSizePlan.from_terms(
        inputs,
        effective_kv_cache_dtype=effective,
        page=page,
        state=state,
        backend=name,
        alignment=max(common, first, MLA_HYBRID_ALIGNMENT),
        grid=grid,
        automatic=block,
        index_kpool=ckpt.index_kpool,
        engine="vllm",
    )
