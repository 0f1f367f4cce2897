"""GLM-5.3-Flash's KV cache: vLLM 0.33.0's own KV-cache planning and the closed form agree on
every supported configuration, and `dflash-serve plan` prints vLLM's figures at every TP size."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest
from dflash_ops.plan import glm5_next, glm5_next_capacity
from dflash_ops.plan.draft import draft_profile_from_config
from dflash_ops.plan.glm5_next import load_glm5_next, plan_block_size
from dflash_ops.plan.glm5_next_capacity import DEFAULT_GLM_DFLASH2_CONFIG
from dflash_ops.plan.kv_capacity import CapacityInputs
from dflash_ops.plan.model import BlockSizeInputs
from dflash_ops.plan.planner import capacity_inputs

pytestmark = pytest.mark.vllm033

CKPT = load_glm5_next()
GRID = list(itertools.product(glm5_next.SPARSE_MLA_GPUS, (1, 2, 4, 8), ("auto", "bfloat16", "fp8")))
DRAFT = glm5_next_capacity.default_glm_dflash2_profile()
# Weights that leave room for a 128k request on every GPU at every TP (the estimate's bf16 experts
# fit only at TP8).
WEIGHTS_GIB = 40.0


def inputs_for(gpu: str, tp: int, method: str) -> CapacityInputs:
    return capacity_inputs(
        CKPT,
        gpu=gpu,
        tp=tp,
        method=method,  # type: ignore[arg-type]
        draft=DRAFT if method == "dflash" else None,
        weights_gib=WEIGHTS_GIB / tp,
        max_model_len=131072,
    ).inputs


def both(plan: object, inputs: CapacityInputs, draft: object) -> tuple:  # type: ignore[type-arg]
    from dflash_ops.plan.vllm_engine import glm5_next_capacity as exact_engine

    exact = exact_engine.kv_capacity(CKPT, plan, draft=draft, inputs=inputs)  # type: ignore[arg-type]
    model = glm5_next_capacity.kv_capacity(CKPT, plan, draft=draft, inputs=inputs)  # type: ignore[arg-type]
    assert exact.engine == "vllm" and model.engine == "closed-form"
    return exact, model


@pytest.mark.parametrize(("gpu", "tp", "kv"), GRID)
def test_engines_agree_for_every_k_and_method(gpu: str, tp: int, kv: str) -> None:
    for method, ks in {"dflash": range(1, 16), "ngram": (1, 7, 15), "off": (0,)}.items():
        inputs = inputs_for(gpu, tp, method)
        draft = DRAFT if method == "dflash" else None
        for k in ks:
            plan = plan_block_size(CKPT, BlockSizeInputs(gpu=gpu, tp=tp, kv_cache_dtype=kv, k=k))  # type: ignore[arg-type]
            exact, model = both(plan, inputs, draft)
            assert exact.comparable() == model.comparable(), (gpu, tp, kv, method, k)
            assert exact.start_error == model.start_error


@pytest.mark.parametrize(
    "variant", ["full-attention draft", "synchronous, 2048 batched", "does not start"]
)
def test_engines_agree_off_the_default_path(variant: str) -> None:
    config = dict(DEFAULT_GLM_DFLASH2_CONFIG)
    if variant == "full-attention draft":
        config["layer_types"] = None
    draft = draft_profile_from_config(config, "t")
    inputs = inputs_for("h200", 2, "dflash")
    if variant == "synchronous, 2048 batched":
        inputs = inputs.model_copy(
            update={"async_scheduling": False, "max_num_batched_tokens": 2048}
        )
    if variant == "does not start":
        # 3 GiB left: a 1M-token request needs about 12.
        inputs = inputs.model_copy(
            update={
                "target_weights_gib": 118.0,
                "max_model_len": 1 << 20,
                "context_lengths": (8192,),
            }
        )
    for k in (1, 7, 15):
        plan = plan_block_size(CKPT, BlockSizeInputs(gpu="h200", tp=2, k=k))
        exact, model = both(plan, inputs, draft)
        assert exact.comparable() == model.comparable(), (variant, k)
        assert exact.start_error == model.start_error
    assert (exact.start_error is not None) == (variant == "does not start")


def test_vllm_groups_the_draft_apart_and_pads_the_kda_state_to_the_mla_page() -> None:
    """The heads-up of the reference report: vLLM 0.33.0 places the draft's sliding-window layers
    in a group of their own; the KDA layers' state pages are padded to the MLA page."""
    from dflash_ops.plan.vllm_engine import glm5_next_capacity as exact_engine

    plan = plan_block_size(CKPT, BlockSizeInputs(gpu="h100", tp=2, k=7))
    _, specs, groups = exact_engine.kv_cache_groups(
        CKPT, plan, draft=DRAFT, inputs=inputs_for("h100", 2, "dflash")
    )
    draft_groups = [g for g in groups if g.layer_names[0].startswith("draft.")]
    assert len(draft_groups) == 1 and len(draft_groups[0].layer_names) == 5
    assert all(name.startswith("draft.") for name in draft_groups[0].layer_names)
    kda = specs["model.layers.0.self_attn"]
    mla = specs["model.layers.3.self_attn.attn"]
    assert kda.page_size_bytes == mla.page_size_bytes == 2560 * 1024


@pytest.mark.parametrize("tp", (1, 2, 4, 8))
def test_the_plan_prints_vllms_own_capacity_at_every_tp(tp: int) -> None:
    """`dflash-serve plan` for GLM-5.3-Flash + DFlash2 (the vLLM engine) gives, per k, the block
    size and KV capacity vLLM 0.33.0's planning computes here for the same inputs; the closed
    form (what plans without vLLM) prints the same."""
    from dflash_ops.plan.vllm_engine import glm5_next as exact_blocks
    from dflash_ops.plan.vllm_engine import glm5_next_capacity as exact_engine

    gpu = "b200"
    args = ["--model", "glm-5.3-flash", "--gpu", gpu, "--tp", str(tp), "--k", "3-4",
            "--weights-gib", str(WEIGHTS_GIB / tp), "--max-model-len", "131072",
            "--format", "json"]  # fmt: skip
    printed = {}
    for engine in ("vllm", "closed-form"):
        done = subprocess.run(
            [sys.executable, "-m", "dflash_ops.cli", "plan", *args, "--engine", engine],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        printed[engine] = json.loads(done.stdout)
    assert printed["vllm"]["engine"] == "vllm"
    inputs = inputs_for(gpu, tp, "dflash")
    for k in (3, 4):
        plan = exact_blocks.plan_block_size(CKPT, BlockSizeInputs(gpu=gpu, tp=tp, k=k))
        own = exact_engine.kv_capacity(CKPT, plan, draft=DRAFT, inputs=inputs)
        for engine, out in printed.items():
            block = next(p for p in out["plans"] if p["k"] == k)["recommended_block_size"]
            capacity = out["capacity"][str(k)]
            assert block == plan.recommended_block_size, (engine, k)
            assert capacity["kv_cache_tokens"] == own.kv_cache_tokens, (engine, k)
            assert capacity["num_blocks"] == own.num_blocks, (engine, k)
            assert capacity["blocks_per_request"] == own.blocks_per_request, (engine, k)
