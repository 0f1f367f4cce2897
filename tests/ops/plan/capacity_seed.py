"""The seed's measured KV capacity and the calibration the capacity tests share.

Measured on 2x A100-80GB, TP2, AWQ target, default max_model_len (262,144), vLLM's logged
"KV cache size": 2,377,232 tokens with DFlash k=3, 2,161,700 with DFlash k=7, 2,138,244 with
MTP-3 (issue 19).
"""

from __future__ import annotations

from collections.abc import Callable

from dflash_ops.plan import closed_form
from dflash_ops.plan.checkpoint import HybridCheckpoint, load_checkpoint
from dflash_ops.plan.draft import default_dflash2_profile
from dflash_ops.plan.kv_capacity import GIB, CapacityInputs, KvCapacity
from dflash_ops.plan.model import BlockSizeInputs
from dflash_ops.plan.planner import capacity_inputs

SEED_DFLASH_K3 = 2_377_232
SEED_DFLASH_K7 = 2_161_700
SEED_MTP_K3 = 2_138_244

Engine = Callable[..., KvCapacity]


def seed_run(engine: Engine, method: str, k: int, inputs: CapacityInputs) -> KvCapacity:
    ckpt = load_checkpoint()
    plan = closed_form.plan_block_size(ckpt, BlockSizeInputs(gpu="a100", tp=2, k=k))
    draft = default_dflash2_profile() if method == "dflash" else None
    return engine(ckpt, plan, method=method, draft=draft, inputs=inputs)  # type: ignore[no-any-return]


def default_inputs(ckpt: HybridCheckpoint, method: str) -> CapacityInputs:
    draft = default_dflash2_profile() if method == "dflash" else None
    return capacity_inputs(ckpt, gpu="a100", tp=2, method=method, draft=draft).inputs  # type: ignore[arg-type]


def blocks_for(tokens: int, per_request: int, max_model_len: int) -> int:
    """The pool size (blocks) whose logged capacity is exactly `tokens`."""
    blocks = tokens * per_request // max_model_len
    while int(blocks / per_request * max_model_len) < tokens:
        blocks += 1
    assert int(blocks / per_request * max_model_len) == tokens, "no pool logs this figure"
    return blocks


def with_budget(inputs: CapacityInputs, budget_bytes: int) -> CapacityInputs:
    """The same deployment with the target weights set so the KV budget is `budget_bytes`."""
    target = (
        inputs.gpu_memory_gib * inputs.gpu_memory_utilization
        - inputs.draft_weights_gib
        - inputs.profile_reserve_gib
        - (budget_bytes + 0.5) / GIB
    )
    return inputs.model_copy(update={"target_weights_gib": target})


def calibrated(engine: Engine) -> tuple[CapacityInputs, KvCapacity]:
    """DFlash k=3 inputs whose budget makes the engine log exactly the seed's k=3 figure."""
    ckpt = load_checkpoint()
    inputs = default_inputs(ckpt, "dflash")
    probe = seed_run(engine, "dflash", 3, inputs)
    per_request = sum(probe.blocks_per_request.values())
    blocks = blocks_for(SEED_DFLASH_K3, per_request, inputs.max_model_len)
    inputs = with_budget(inputs, blocks * probe.bytes_per_block)
    result = seed_run(engine, "dflash", 3, inputs)
    assert result.kv_cache_tokens == SEED_DFLASH_K3, result
    return inputs, result
