"""The closed-form engine on the reference checkpoint, against figures measured on GPUs."""

from __future__ import annotations

import pytest
from dflash_ops.plan import closed_form
from dflash_ops.plan.checkpoint import load_checkpoint
from dflash_ops.plan.model import BlockSizeInputs, ring_capacity, smallest_valid_block_size

CKPT = load_checkpoint()


def plan(gpu: str = "a100", tp: int = 2, k: int = 7, kv: str = "auto") -> closed_form.BlockSizePlan:
    return closed_form.plan_block_size(
        CKPT,
        BlockSizeInputs(gpu=gpu, tp=tp, k=k, kv_cache_dtype=kv),  # type: ignore[arg-type]
    )


def test_k5_reproduces_the_reported_startup_failure() -> None:
    # "QSA ring capacity 12 must divide the attention block size 1616" (brief, section 1).
    p = plan(k=5)
    assert (p.ring_capacity, p.automatic_block_size) == (12, 1616)
    assert not p.automatic_is_valid
    assert p.recommended_block_size == 1632


def test_default_dflash2_block8_on_a100_tp2() -> None:
    p = plan(k=7)
    assert p.attention_page_bytes_per_token == 2 * 1 * 256 * 2
    assert p.mamba_page_source == "gdn"
    assert p.kernel_alignment == 16
    assert p.automatic_block_size == 1648
    assert p.recommended_block_size == 1680
    assert p.recommended_block_size % 12 == 0 and p.recommended_block_size % 16 == 0


def test_hopper_alignment_includes_gdn_checkpoints() -> None:
    p = plan(gpu="h100", k=7)
    assert p.kernel_alignment == 64
    assert p.automatic_block_size % 64 == 0
    assert p.recommended_block_size % 192 == 0  # lcm(64, 12)


def test_fp8_kv_halves_the_attention_page_and_doubles_the_block() -> None:
    bf16, fp8 = plan(k=3), plan(k=3, kv="fp8")
    assert fp8.attention_page_bytes_per_token * 2 == bf16.attention_page_bytes_per_token
    assert fp8.automatic_block_size >= 2 * bf16.automatic_block_size - 16


def test_tp_shrinks_the_gdn_state_but_not_below_one_kv_head() -> None:
    tp4, tp8 = plan(tp=4), plan(tp=8)
    assert tp4.attention_page_bytes_per_token == tp8.attention_page_bytes_per_token == 1024
    assert tp8.gdn_state_bytes * 2 == tp4.gdn_state_bytes


@pytest.mark.parametrize("k", range(16))
def test_recommended_is_the_smallest_valid_size(k: int) -> None:
    p = plan(k=k)
    step = p.recommended_block_size
    assert step >= p.automatic_block_size
    assert step % p.ring_capacity == 0 and step % p.kernel_alignment == 0
    below = [s for s in range(p.automatic_block_size, step) if s % p.ring_capacity == 0]
    assert not [s for s in below if s % p.kernel_alignment == 0]


def test_ring_capacity_formula() -> None:
    assert [ring_capacity(4, k) for k in (0, 3, 4, 5, 8, 9, 15)] == [4, 8, 8, 12, 12, 16, 20]
    assert smallest_valid_block_size(1648, 16, 12) == 1680
