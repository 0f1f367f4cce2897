"""GLM-5.3-Flash's KV cache without vLLM: the closed form's figures worked by hand, the config
defaults transformers fills in, the weights estimate, and invariants over random deployments.
vLLM's own planning: test_glm5_next_capacity_engines_agree.py."""

from __future__ import annotations

import json
import subprocess
import sys
from math import lcm
from pathlib import Path

import pytest
from dflash_ops.errors import UserError
from dflash_ops.plan import glm5_next, glm5_next_capacity
from dflash_ops.plan.glm5_next import load_glm5_next, plan_block_size, read_glm5_next
from dflash_ops.plan.kv_capacity import GIB
from dflash_ops.plan.model import BlockSizeInputs
from dflash_ops.plan.planner import capacity_inputs
from hypothesis import given, settings
from hypothesis import strategies as st

CKPT = load_glm5_next()
DRAFT = glm5_next_capacity.default_glm_dflash2_profile()


def capacity(gpu: str, tp: int, k: int, **inputs: object) -> object:
    method = "dflash" if k else "off"
    assumptions = capacity_inputs(
        CKPT,
        gpu=gpu,
        tp=tp,
        method=method,
        draft=DRAFT if k else None,
        **inputs,  # type: ignore[arg-type]
    )
    plan = plan_block_size(CKPT, BlockSizeInputs(gpu=gpu, tp=tp, k=k))
    return glm5_next_capacity.kv_capacity(
        CKPT, plan, draft=assumptions.draft, inputs=assumptions.inputs
    )


def test_the_h200_tp2_figures_by_hand() -> None:
    """Block 2560: 11 MLA layers hold 2560 latents of 1024 B and 160 pooled indexer keys of
    132 B (128 fp8 values and a float32 scale) per block; blocks lie a multiple of the MLA row
    (1,024 B) and of the indexer's 512-token kernel page (32 x 132 = 4,224 B) apart."""
    c = capacity("h200", 2, 7, weights_gib=40.0, max_model_len=131072)
    widest = 11 * (2560 * 1024 + 160 * 132)
    alignment = lcm(1024, 32 * 132)
    assert c.bytes_per_block == -(-widest // alignment) * alignment == 29_094_912  # type: ignore[attr-defined]
    # Per 128k request: 52 blocks of attention, one tail ring, 4 KDA groups x (2 + k + the
    # FlashKDA prefill checkpoint), the draft's window 2047 + 2 x 8192 tokens in flight.
    assert c.blocks_per_request == {"attention": 52, "ring": 1, "mamba": 4 * 10, "draft": 9}  # type: ignore[attr-defined]
    assert c.groups == {"attention": 1, "ring": 1, "mamba": 4, "draft": 1}  # type: ignore[attr-defined]


def test_without_flashkda_the_kda_groups_hold_no_checkpoint_block() -> None:
    """FlashKDA needs a bounded gate: without one the Triton kernel exports no checkpoints."""
    unbounded = CKPT.model_copy(update={"linear_lower_bound": None})
    assert glm5_next_capacity.uses_flashkda(CKPT, "h100")
    assert not glm5_next_capacity.uses_flashkda(unbounded, "h100")
    plan = plan_block_size(unbounded, BlockSizeInputs(gpu="h100", tp=2, k=7))
    inputs = capacity_inputs(
        unbounded, gpu="h100", tp=2, method="dflash", draft=DRAFT, weights_gib=30.0
    ).inputs
    c = glm5_next_capacity.kv_capacity(unbounded, plan, draft=DRAFT, inputs=inputs)
    assert c.blocks_per_request["mamba"] == 4 * (2 + 7)


def test_the_weights_estimate_counts_the_routed_experts_at_their_bits() -> None:
    experts = 42 * 288 * 3 * 4096 * 2048  # sparse layers x experts x gate/up/down
    bf16 = glm5_next_capacity.estimate_weights_gib_per_rank(CKPT, 1, 16)
    int4 = glm5_next_capacity.estimate_weights_gib_per_rank(CKPT, 1, 4)
    assert bf16 - int4 == pytest.approx(experts * (2 - 0.5 * 1.03) / GIB)
    assert glm5_next_capacity.estimate_weights_gib_per_rank(CKPT, 8, 16) == pytest.approx(bf16 / 8)
    assert 550 < bf16 < 650


def write_config(tmp_path: Path, text: dict[str, object]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "glm5_next_text", **text}))
    return path


def test_a_config_reads_with_the_defaults_transformers_fills_in(tmp_path: Path) -> None:
    """Fields left out take Glm5NextTextConfig's defaults; the layer patterns follow the layer
    count as its __post_init__ derives them; linear_attn_config names the KDA fields."""
    path = write_config(
        tmp_path,
        {"num_hidden_layers": 8, "linear_attn_config": {"num_heads": 32, "gate_lower_bound": None}},
    )
    ckpt = read_glm5_next(path, json.loads(path.read_text()))
    assert ckpt.kda_layer_ids == (0, 1, 2, 4, 5, 6)
    assert ckpt.mlp_layer_types == ("dense",) * 3 + ("sparse",) * 5
    assert ckpt.linear_num_heads == 32 and ckpt.linear_lower_bound == -5.0  # safe_gate
    assert ckpt.kv_lora_rank == CKPT.kv_lora_rank and ckpt.index_topk == CKPT.index_topk
    full = write_config(tmp_path, {"layer_types": ["full_attention"] * 45})
    assert read_glm5_next(full, json.loads(full.read_text())).kda_layer_ids == ()


def test_layer_patterns_of_the_wrong_length_are_one_line(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"num_hidden_layers": 4, "layer_types": ["linear_attention"]})
    with pytest.raises(UserError, match="layer_types has 1 entries for num_hidden_layers 4"):
        read_glm5_next(path, json.loads(path.read_text()))
    done = subprocess.run(
        [sys.executable, "-m", "dflash_ops.cli", "plan", "--config", str(path), "--gpu", "h100"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "layer_types has 1 entries" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@settings(max_examples=60, deadline=None)
@given(
    gpu=st.sampled_from(glm5_next.SPARSE_MLA_GPUS),
    tp=st.sampled_from((1, 2, 4, 8)),
    k=st.integers(0, 15),
    weights=st.floats(5, 60),
    length=st.sampled_from((8192, 32768, 131072, 1 << 20)),
)
def test_the_pool_fits_the_budget_and_longer_requests_fit_fewer(
    gpu: str, tp: int, k: int, weights: float, length: int
) -> None:
    c = capacity(
        gpu, tp, k, weights_gib=weights, max_model_len=length, context_lengths=(8192, 32768)
    )
    assert c.num_blocks * c.bytes_per_block <= c.kv_budget_gib_per_rank * GIB + c.bytes_per_block  # type: ignore[attr-defined]
    fits = list(c.requests_at.values())  # type: ignore[attr-defined]
    assert fits == sorted(fits, reverse=True)
    assert (c.start_error is None) == (  # type: ignore[attr-defined]
        c.bytes_per_block * sum(c.blocks_per_request.values())  # type: ignore[attr-defined]
        <= capacity_inputs(CKPT, gpu=gpu, tp=tp, method="dflash" if k else "off",
                           draft=DRAFT if k else None, weights_gib=weights,
                           max_model_len=length).inputs.budget_bytes - c.bytes_per_block  # type: ignore[attr-defined]
    )  # fmt: skip
