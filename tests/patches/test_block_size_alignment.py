"""Patch 0003 through vLLM's own alignment code (`Platform.update_block_size_for_backend`),
with the model's real QSA key rings and the model class's block-size hook lifted from the
patched source (the model file needs GPU kernels to import)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from dflash_ops.plan import closed_form
from dflash_ops.plan.checkpoint import load_checkpoint
from dflash_ops.plan.gpus import QSA_KERNEL_BLOCK, gpu_profile
from dflash_ops.plan.model import BlockSizeInputs, ring_capacity

from tests.patches.conftest import ProbeRunner

pytestmark = pytest.mark.vllm033

CKPT = load_checkpoint()


def test_unpatched_vllm_reproduces_the_startup_failure(run_probe: ProbeRunner) -> None:
    rows = run_probe(None, "block-sizes", "--tp", "2", "--k", "5", "7")["rows"]
    assert [r["spec_ok"] for r in rows] == [False, False]
    assert rows[0]["error"] == (
        "AssertionError: QSA ring capacity 12 must divide the attention block size 1616"
    )


@pytest.mark.parametrize(
    ("gpu", "tp"), [("a100", 1), ("a100", 2), ("a100", 4), ("h100", 1), ("h100", 2), ("h100", 4)]
)
def test_automatic_block_size_is_divisible_by_the_ring(
    patched_vllm: Path, run_probe: ProbeRunner, gpu: str, tp: int
) -> None:
    rows = run_probe(patched_vllm, "block-sizes", "--gpu", gpu, "--tp", str(tp))["rows"]
    assert [r["k"] for r in rows] == list(range(16))
    for row in rows:
        k = row["k"]
        assert row["spec_ok"], row
        assert row["ring_capacity"] == ring_capacity(4, k)
        assert row["block_size"] % row["ring_capacity"] == 0
        # The patched engine picks exactly what the planner recommends.
        plan = closed_form.plan_block_size(CKPT, BlockSizeInputs(gpu=gpu, tp=tp, k=k))
        assert row["block_size"] == plan.recommended_block_size, row


@pytest.mark.parametrize(("gpu", "tp"), [("h100", 2), ("b200", 8)])
def test_glm_block_sizes_are_the_same_patched_or_not(
    patched_vllm: Path, run_probe: ProbeRunner, gpu: str, tp: int
) -> None:
    """GLM-5.3-Flash's model classes define no block-size alignment hook: patch 0003 leaves its
    block where unpatched vLLM puts it, the planner's figure."""
    from dflash_ops.plan import glm5_next

    args = ("glm5-next-block-sizes", "--gpu", gpu, "--tp", str(tp), "--k", "0", "7", "15")
    patched, unpatched = run_probe(patched_vllm, *args), run_probe(None, *args)
    assert patched["alignment_hook"] and not unpatched["alignment_hook"]
    assert patched["rows"] == unpatched["rows"]
    ckpt = glm5_next.load_glm5_next()
    for row in patched["rows"]:
        inputs = BlockSizeInputs(gpu=gpu, tp=tp, k=row["k"])
        assert row["block_size"] == glm5_next.plan_block_size(ckpt, inputs).automatic_block_size


@pytest.mark.parametrize(
    ("user", "k", "tp", "expected"),
    [
        (16, 6, 2, 1632),  # started before the series: must still start, at the same size
        (24, 7, 2, 1680),  # unpatched: rounded to 1664, which the ring 12 does not divide
        (36, 7, 2, 1680),
        (1680, 7, 2, 1680),
        (1000, 5, 4, 1008),  # series v2 grew these to 3024
        (36, 2, 1, 1632),  # series v2: 1664
    ],
)
def test_a_users_block_size_ends_valid(
    patched_vllm: Path, run_probe: ProbeRunner, user: int, k: int, tp: int, expected: int
) -> None:
    (row,) = run_probe(
        patched_vllm, "block-sizes", "--tp", str(tp), "--k", str(k), "--user-block-size", str(user)
    )["rows"]
    assert row == {"k": k, "block_size": expected, "ring_capacity": ring_capacity(4, k),
                   "spec_ok": True}  # fmt: skip


USER_SIZES = [16, 24, 32, 36, 48, 64, 96, 100, 128, 256, 512, 1000, 1024, 1536, 1600, 1632, 1680,
              2048, 4096]  # fmt: skip


def grid(run_probe: ProbeRunner, tree: Path | None) -> dict[tuple[str, int, int, int], int]:
    rows: list[dict[str, Any]] = run_probe(
        tree, "block-size-grid", "--user-block-size", *map(str, USER_SIZES)
    )["rows"]
    return {(r["gpu"], r["tp"], r["k"], r["user"]): r["block_size"] for r in rows}


def test_only_sizes_that_would_fail_change(patched_vllm: Path, run_probe: ProbeRunner) -> None:
    """Over A100/H100/H200/B200 x TP 1/2/4/8 x k 0..15, automatic and 19 user sizes: a size that
    starts unpatched (the ring divides it) is unchanged; one that would fail at startup becomes
    the smallest size at or above it that the ring, the QSA kernel block (16) and the GPU's
    prefill-checkpoint alignment all divide."""
    unpatched, patched = grid(run_probe, None), grid(run_probe, patched_vllm)
    assert unpatched.keys() == patched.keys() and len(unpatched) == 4 * 4 * 16 * 20
    grown = 0
    for (gpu, tp, k, user), size in unpatched.items():
        ring = ring_capacity(4, k)
        if size % ring == 0:
            assert patched[gpu, tp, k, user] == size, (gpu, tp, k, user)
            continue
        step = math.lcm(ring, QSA_KERNEL_BLOCK, gpu_profile(gpu).prefill_checkpoint_alignment or 1)
        assert patched[gpu, tp, k, user] == step * math.ceil(size / step), (gpu, tp, k, user)
        grown += 1
    assert grown > 1000  # most k fail unpatched: the grid is not vacuous


def test_unpatched_user_sizes_show_what_the_patch_fixes(run_probe: ProbeRunner) -> None:
    rows = {
        (user, k): run_probe(None, "block-sizes", "--k", str(k), "--user-block-size", str(user))[
            "rows"
        ][0]
        for user, k in ((16, 6), (24, 7))
    }
    assert rows[(16, 6)]["block_size"] == 1632 and rows[(16, 6)]["spec_ok"]
    assert not rows[(24, 7)]["spec_ok"]
    assert "must divide the attention block size 1664" in rows[(24, 7)]["error"]


def test_sync_check_the_platform_holds_no_model_code(patched_vllm: Path) -> None:
    """A sync check on the patched platform file (the semantic tests are above)."""
    source = (patched_vllm / "vllm" / "platforms" / "interface.py").read_text()
    assert "qwen4_exp" not in source and "QSA" not in source
    assert "get_block_size_alignment_from_config" in source
