"""vLLM 0.33.0's KV-cache planning and the closed form agree, and vLLM's own code reproduces
the seed's measured capacity table."""

from __future__ import annotations

import itertools

import pytest
from dflash_ops.plan import closed_form, kv_capacity_closed_form
from dflash_ops.plan.checkpoint import load_checkpoint
from dflash_ops.plan.draft import DEFAULT_DFLASH2_CONFIG, draft_profile_from_config
from dflash_ops.plan.gpus import GPUS
from dflash_ops.plan.kv_capacity import CapacityInputs
from dflash_ops.plan.model import BlockSizeInputs
from dflash_ops.plan.planner import capacity_inputs

from tests.ops.plan.capacity_seed import (
    SEED_DFLASH_K3,
    SEED_DFLASH_K7,
    SEED_MTP_K3,
    calibrated,
    default_inputs,
    seed_run,
)

pytestmark = pytest.mark.vllm033

CKPT = load_checkpoint()
GRID = list(itertools.product(sorted(GPUS), (1, 2, 4, 8), ("bfloat16", "fp8")))
METHODS = {"dflash": range(1, 16), "mtp": range(1, 16), "off": [0]}


def both(method: str, plan: object, inputs: CapacityInputs, draft: object) -> tuple:  # type: ignore[type-arg]
    from dflash_ops.plan import vllm_engine

    exact = vllm_engine.kv_capacity(CKPT, plan, method=method, draft=draft, inputs=inputs)
    model = kv_capacity_closed_form.kv_capacity(
        CKPT, plan, method=method, draft=draft, inputs=inputs
    )
    assert exact.engine == "vllm" and model.engine == "closed-form"
    return exact, model


@pytest.mark.parametrize(("gpu", "tp", "kv"), GRID)
def test_engines_agree_for_every_k_and_method(gpu: str, tp: int, kv: str) -> None:
    for method, ks in METHODS.items():
        draft = None
        if method == "dflash":
            draft = draft_profile_from_config(DEFAULT_DFLASH2_CONFIG, "t")
        # A budget that fits a full-length request at every TP.
        inputs = capacity_inputs(
            CKPT,
            gpu=gpu,
            tp=tp,
            method=method,  # type: ignore[arg-type]
            draft=draft,
            weights_gib=56 / tp,
            draft_weights_gib=0.5,
        ).inputs
        for k in ks:
            block = BlockSizeInputs(gpu=gpu, tp=tp, kv_cache_dtype=kv, k=k)  # type: ignore[arg-type]
            plan = closed_form.plan_block_size(CKPT, block)
            exact, model = both(method, plan, inputs, draft)
            assert exact.comparable() == model.comparable(), (gpu, tp, kv, method, k)
            assert (exact.start_error is None) == (model.start_error is None)


@pytest.mark.parametrize(
    "variant",
    ["ngram", "full-attention draft", "synchronous, 8192 batched", "short max_model_len",
     "does not start"],
)  # fmt: skip
def test_engines_agree_off_the_default_path(variant: str) -> None:
    method = "ngram" if variant == "ngram" else "dflash"
    config = dict(DEFAULT_DFLASH2_CONFIG)
    if variant == "full-attention draft":
        config["layer_types"] = None
    draft = draft_profile_from_config(config, "t") if method == "dflash" else None
    inputs = default_inputs(CKPT, method)
    if variant == "synchronous, 8192 batched":
        inputs = inputs.model_copy(
            update={"async_scheduling": False, "max_num_batched_tokens": 8192}
        )
    if variant == "short max_model_len":
        inputs = inputs.model_copy(update={"max_model_len": 3000, "context_lengths": (3000,)})
    if variant == "does not start":
        inputs = inputs.model_copy(update={"target_weights_gib": 66.5})
    for k in (1, 4, 7, 15):
        plan = closed_form.plan_block_size(CKPT, BlockSizeInputs(gpu="a100", tp=2, k=k))
        exact, model = both(method, plan, inputs, draft)
        assert exact.comparable() == model.comparable(), (variant, k)
        assert exact.start_error == model.start_error
    assert (exact.start_error is not None) == (variant == "does not start")


def test_vllm_reproduces_the_seed_table() -> None:
    from dflash_ops.plan import vllm_engine

    inputs, k3 = calibrated(vllm_engine.kv_capacity)
    k7 = seed_run(vllm_engine.kv_capacity, "dflash", 7, inputs)
    assert k7.kv_cache_tokens / k3.kv_cache_tokens == pytest.approx(
        SEED_DFLASH_K7 / SEED_DFLASH_K3, rel=0.01
    )
    mtp_inputs = default_inputs(CKPT, "mtp").model_copy(
        update={"target_weights_gib": inputs.target_weights_gib}
    )
    mtp = seed_run(vllm_engine.kv_capacity, "mtp", 3, mtp_inputs)
    assert mtp.kv_cache_tokens < k3.kv_cache_tokens
    assert mtp.kv_cache_tokens == pytest.approx(SEED_MTP_K3, rel=0.02)
    # The groups vLLM itself formed: QSA main + compressed keys, rings, 3 GDN + 1 PLE, draft.
    assert k3.groups == {"attention": 1, "ring": 1, "mamba": 4, "draft": 1}
