"""vLLM 0.33.0 imported on CPU for planning: the GPU-only pieces stood in for, and a real
`VllmConfig` built from a checkpoint config."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from dflash_ops.plan.checkpoint import HybridCheckpoint
from dflash_ops.plan.gpus import QSA_KERNEL_BLOCK
from dflash_ops.plan.model import BlockSizeInputs

REQUIRED_VLLM_VERSION = "0.33.0"


def vllm_available() -> bool:
    """True when the importable vLLM is exactly 0.33.0 (the CPU build is another version)."""
    try:
        from importlib.metadata import version

        return version("vllm") == REQUIRED_VLLM_VERSION
    except Exception:
        return False


@cache
def vllm_modules() -> dict[str, Any]:
    # The 0.33.0 GPU wheel picks no platform on a CPU-only host; the CPU platform lets its
    # config classes build. Alignment below runs the base `Platform` code, not the CPU one.
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    logging.getLogger("vllm").setLevel(logging.ERROR)
    import torch
    from torch import nn
    from vllm.config import CacheConfig, ModelConfig, ParallelConfig, VllmConfig
    from vllm.config.speculative import SpeculativeConfig
    from vllm.model_executor.layers.mamba import abstract as mamba_abstract
    from vllm.model_executor.layers.mamba.mamba_utils import (
        MambaStateDtypeCalculator,
        MambaStateShapeCalculator,
    )
    from vllm.model_executor.models import ModelRegistry
    from vllm.models.qwen4_exp.common.qsa_cache import QSAStateBackend
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, get_kv_quant_mode

    class QSABackendForPlanning(FlashAttentionBackend):
        """Kernel block sizes of `Qwen4ExpQSAFlashAttentionBackend` (nvidia/qsa.py)."""

        @staticmethod
        def get_name() -> str:
            return "QWEN4_EXP_QSA_TRITON"

        @staticmethod
        def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> list[Any]:
            return [MultipleOf(QSA_KERNEL_BLOCK)]

    backends = [QSABackendForPlanning, QSAStateBackend]

    class PlanningPlatform(Platform):
        @classmethod
        def _find_non_ssm_backends(cls, vllm_config: Any) -> list[Any]:
            return list(backends)

    def gdn_spec(vllm_config: Any) -> Any:
        hf = vllm_config.model_config.hf_text_config
        cache_config = vllm_config.cache_config
        num_spec = vllm_config.num_speculative_tokens
        return MambaSpec(
            shapes=MambaStateShapeCalculator.gated_delta_net_state_shape(
                vllm_config.parallel_config.tensor_parallel_size,
                hf.linear_num_key_heads,
                hf.linear_num_value_heads,
                hf.linear_key_head_dim,
                hf.linear_value_head_dim,
                hf.linear_conv_kernel_dim,
                num_spec,
            ),
            dtypes=MambaStateDtypeCalculator.gated_delta_net_state_dtype(
                vllm_config.model_config.dtype,
                cache_config.mamba_cache_dtype,
                cache_config.mamba_ssm_cache_dtype,
            ),
            block_size=-1,
        )

    def ple_spec(vllm_config: Any) -> Any:
        hf = vllm_config.model_config.hf_text_config
        conv_state_len = (hf.ple_conv_kernel_size - 1) * hf.ngram_size
        return MambaSpec(
            shapes=MambaStateShapeCalculator.short_conv_state_shape(
                tp_world_size=1,
                intermediate_size=hf.hidden_size * hf.hc_count,
                conv_kernel=conv_state_len + 1,
                num_spec=vllm_config.num_speculative_tokens,
            ),
            dtypes=MambaStateDtypeCalculator.short_conv_state_dtype(
                vllm_config.model_config.dtype, vllm_config.cache_config.mamba_cache_dtype
            ),
            block_size=-1,
            tp_replicated=True,
        )

    class Qwen4ExpForPlanning(nn.Module):
        """Registry entry with the Qwen4Exp Mamba specs; never instantiated."""

        is_hybrid = True
        has_inner_state = True

        def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
            raise RuntimeError("Qwen4ExpForPlanning only answers spec queries")

        def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
            raise NotImplementedError

        def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            raise NotImplementedError

        def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
            raise NotImplementedError

        @classmethod
        def get_mamba_specs_from_config(cls, vllm_config: Any) -> tuple[Any, ...]:
            return (gdn_spec(vllm_config), ple_spec(vllm_config))

    return {
        "torch": torch,
        "CacheConfig": CacheConfig,
        "ModelConfig": ModelConfig,
        "ParallelConfig": ParallelConfig,
        "VllmConfig": VllmConfig,
        "SpeculativeConfig": SpeculativeConfig,
        "ModelRegistry": ModelRegistry,
        "mamba_abstract": mamba_abstract,
        "PlanningPlatform": PlanningPlatform,
        "backends": backends,
        "FullAttentionSpec": FullAttentionSpec,
        "get_kv_quant_mode": get_kv_quant_mode,
        "MultipleOf": MultipleOf,
        "Qwen4ExpForPlanning": Qwen4ExpForPlanning,
        "gdn_spec": gdn_spec,
        "ple_spec": ple_spec,
    }


@contextlib.contextmanager
def prefill_checkpoint_alignment(value: int | None) -> Iterator[None]:
    module = vllm_modules()["mamba_abstract"]
    original = module.get_mamba_prefill_checkpoint_alignment
    module.get_mamba_prefill_checkpoint_alignment = lambda vllm_config: value
    try:
        yield
    finally:
        module.get_mamba_prefill_checkpoint_alignment = original


@cache
def checkpoint_model_config(config_path: str, architecture: str, model_cls: Any = None) -> Any:
    """A real `ModelConfig` of the checkpoint config, its architecture served by a planning
    stand-in (`model_cls`, Qwen4Exp's by default)."""
    v = vllm_modules()
    v["ModelRegistry"].register_model(architecture, model_cls or v["Qwen4ExpForPlanning"])
    # ModelConfig wants a checkpoint directory; the config alone is enough without a tokenizer.
    directory = Path(tempfile.mkdtemp(prefix="dflash-plan-"))
    (directory / "config.json").write_bytes(Path(config_path).read_bytes())
    return v["ModelConfig"](model=str(directory), skip_tokenizer_init=True, dtype="auto")


def ngram_speculative_config(k: int, model_config: Any, parallel_config: Any) -> Any:
    """Speculation with k tokens for planning: the block size and KV cache depend on the method
    only through k, and n-gram needs no draft checkpoint. None for k 0."""
    if k == 0:
        return None
    return vllm_modules()["SpeculativeConfig"](
        method="ngram",
        num_speculative_tokens=k,
        prompt_lookup_max=3,
        prompt_lookup_min=2,
        target_model_config=model_config,
        target_parallel_config=parallel_config,
    )


def build_vllm_config(ckpt: HybridCheckpoint, inputs: BlockSizeInputs) -> Any:
    """A real `VllmConfig` for this configuration (speculation as n-gram with k tokens: the
    block size depends on the method only through k, and n-gram needs no draft checkpoint)."""
    import copy

    v = vllm_modules()
    model_config = copy.deepcopy(checkpoint_model_config(ckpt.source, ckpt.architecture))
    parallel_config = v["ParallelConfig"](
        tensor_parallel_size=inputs.tp, enable_expert_parallel=True
    )
    speculative = ngram_speculative_config(inputs.k, model_config, parallel_config)
    return v["VllmConfig"](
        model_config=model_config,
        cache_config=v["CacheConfig"](
            mamba_cache_mode="align",
            cache_dtype=inputs.kv_cache_dtype,
        ),
        parallel_config=parallel_config,
        speculative_config=speculative,
    )


def kv_torch_dtype(cache_dtype: str) -> Any:
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE

    return STR_DTYPE_TO_TORCH_DTYPE[cache_dtype]
