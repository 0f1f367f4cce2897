"""Patch 0003 through vLLM's own alignment code, with the model's real QSA key rings."""

from __future__ import annotations

from pathlib import Path

import pytest
from dflash_ops.plan import closed_form
from dflash_ops.plan.checkpoint import load_checkpoint
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


@pytest.mark.parametrize(("gpu", "tp"), [("a100", 1), ("a100", 2), ("a100", 4), ("h100", 2)])
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


def test_user_block_size_the_ring_does_not_divide_names_the_smallest_valid(
    patched_vllm: Path, run_probe: ProbeRunner
) -> None:
    rows = run_probe(patched_vllm, "block-sizes", "--k", "7", "--user-block-size", "1648")["rows"]
    assert not rows[0]["spec_ok"]
    assert "Block size 1648 is not a multiple of the QSA ring capacity 12" in rows[0]["error"]
    assert "The smallest valid block size is 1680" in rows[0]["error"]
    rows = run_probe(patched_vllm, "block-sizes", "--k", "7", "--user-block-size", "1680")["rows"]
    assert rows[0] == {"k": 7, "block_size": 1680, "ring_capacity": 12, "spec_ok": True}
