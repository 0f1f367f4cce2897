"""The exact planner engine: vLLM 0.33.0's own configuration and alignment code, on CPU.

What runs is vLLM's: `ModelConfig`/`VllmConfig` built from the checkpoint config (including the
Qwen4Exp config hooks that set the Mamba SSM dtype), `FullAttentionSpec`/`MambaSpec` page sizes,
`MambaStateShapeCalculator`/`MambaStateDtypeCalculator`, and
`Platform.update_block_size_for_backend` (backend preference, `_align_hybrid_block_size`, the
post-alignment check). Three GPU-only pieces cannot import on a CPU and are stood in for, each
reproducing the 0.33.0 source it replaces:

- the model class (`vllm/models/qwen4_exp/nvidia/model.py` needs GPU kernels): a planning
  class registered under the checkpoint's architecture whose `get_mamba_specs_from_config`
  makes the same two `MambaSpec`s (GDN layers, PLE layer) with the same calculator calls;
- the QSA attention backend (`nvidia/qsa.py`): a `FlashAttentionBackend` subclass with the same
  `get_supported_kernel_block_sizes` (`MultipleOf(16)`), beside vLLM's real `QSAStateBackend`;
- the layers' prefill-checkpoint alignment, which needs built layers: the GPU profile's value
  (`dflash_ops.plan.gpus`), what `get_mamba_prefill_checkpoint_alignment` returns there.
"""

from dflash_ops.plan.vllm_engine.block_size import plan_block_size
from dflash_ops.plan.vllm_engine.kv_capacity import kv_cache_groups, kv_capacity
from dflash_ops.plan.vllm_engine.runtime import build_vllm_config, vllm_available

__all__ = [
    "build_vllm_config",
    "kv_cache_groups",
    "kv_capacity",
    "plan_block_size",
    "vllm_available",
]
