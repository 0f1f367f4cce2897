"""vLLM 0.33.0's own code and the closed form agree on every supported configuration."""

from __future__ import annotations

import itertools

import pytest
from dflash_ops.plan import closed_form
from dflash_ops.plan.checkpoint import load_checkpoint
from dflash_ops.plan.gpus import GPUS
from dflash_ops.plan.model import BlockSizeInputs

pytestmark = pytest.mark.vllm033

CKPT = load_checkpoint()
GRID = list(itertools.product(sorted(GPUS), (1, 2, 4, 8), ("bfloat16", "fp8")))


@pytest.mark.parametrize(("gpu", "tp", "kv"), GRID)
def test_engines_agree_for_every_k(gpu: str, tp: int, kv: str) -> None:
    from dflash_ops.plan import vllm_engine

    assert vllm_engine.vllm_available()
    for k in range(16):
        inputs = BlockSizeInputs(gpu=gpu, tp=tp, kv_cache_dtype=kv, k=k)  # type: ignore[arg-type]
        exact = vllm_engine.plan_block_size(CKPT, inputs)
        model = closed_form.plan_block_size(CKPT, inputs)
        assert exact.engine == "vllm"
        assert exact.comparable() == model.comparable(), (gpu, tp, kv, k)


def test_vllm_engine_reports_the_reference_figure() -> None:
    from dflash_ops.plan import vllm_engine

    plan = vllm_engine.plan_block_size(CKPT, BlockSizeInputs(gpu="a100", tp=2, k=5))
    assert plan.automatic_block_size == 1616 and plan.ring_capacity == 12


def test_vllm_config_is_real_and_went_through_the_qwen4exp_hooks() -> None:
    from dflash_ops.plan import vllm_engine
    from vllm.config import VllmConfig

    config = vllm_engine.build_vllm_config(CKPT, BlockSizeInputs(gpu="a100", tp=2, k=7))
    assert isinstance(config, VllmConfig)
    # Qwen3_5ForConditionalGenerationConfig copies mamba_ssm_dtype into the cache config.
    assert config.cache_config.mamba_ssm_cache_dtype == "float32"
    assert config.num_speculative_tokens == 7
