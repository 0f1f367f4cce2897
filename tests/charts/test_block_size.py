"""The chart's block size is the planner's, and wrong values fail `helm install` readably."""

from __future__ import annotations

import itertools

import pytest
from dflash_ops.errors import UserError
from dflash_ops.plan import closed_form
from dflash_ops.plan.checkpoint import load_checkpoint
from dflash_ops.plan.model import BlockSizeInputs

from tests.charts.conftest import arg_after, container, render

CKPT = load_checkpoint()


@pytest.mark.parametrize(("gpu", "tp"), list(itertools.product(["a100", "h100"], [1, 2, 4])))
def test_chart_block_size_equals_the_planner(gpu: str, tp: int) -> None:
    for k in range(16):
        method = "off" if k == 0 else "dflash"
        sets = [
            f"gpu.type={gpu}",
            f"engine.tensorParallelSize={tp}",
            f"speculative.method={method}",
        ]
        if k:
            sets.append(f"speculative.numSpeculativeTokens={k}")
        args = container(render(*sets), "vllm")["args"]
        plan = closed_form.plan_block_size(CKPT, BlockSizeInputs(gpu=gpu, tp=tp, k=k))
        assert int(arg_after(args, "--block-size")) == plan.recommended_block_size, (gpu, tp, k)


def test_fp8_kv_cache_uses_its_own_table() -> None:
    args = container(render("engine.kvCacheDtype=fp8"), "vllm")["args"]
    plan = closed_form.plan_block_size(
        CKPT, BlockSizeInputs(gpu="a100", tp=2, k=7, kv_cache_dtype="fp8")
    )
    assert int(arg_after(args, "--block-size")) == plan.recommended_block_size
    assert arg_after(args, "--kv-cache-dtype") == "fp8"


def test_explicit_valid_block_size_is_kept() -> None:
    args = container(render("engine.blockSize=1728"), "vllm")["args"]
    assert arg_after(args, "--block-size") == "1728"


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ["engine.blockSize=1648"],
            "engine.blockSize 1648 would fail at startup on a100 TP2 with k=7: a valid block "
            "size is a multiple of 48 (kernel alignment 16, QSA ring capacity 12) and at least "
            "1680. Use 1680",
        ),
        (["engine.blockSize=1632"], "at least 1680"),
        (
            ["engine.tensorParallelSize=3"],
            "/engine/tensorParallelSize': value must be one of 1, 2, 4, 8",
        ),
        (
            ["speculative.method=eagle"],
            "/speculative/method': value must be one of 'dflash', 'mtp', 'ngram', 'off'",
        ),
        (
            ["speculative.draftModel="],
            "speculative.method is dflash but speculative.draftModel is empty",
        ),
        (["gpu.type=v100"], "/gpu/type': value must be one of"),
        (["speculative.numSpeculativeTokens=16"], "/speculative/numSpeculativeTokens"),
        (["engin.blockSize=auto"], "additional properties 'engin' not allowed"),
        (
            ["engine.prefixMatchUnit=6"],
            "engine.prefixMatchUnit 6 is not valid with block size 1680: it must divide the "
            "block size and be a multiple of the QSA compress ratio 4",
        ),
        (["engine.prefixMatchUnit=0"], "/engine/prefixMatchUnit"),
    ],
)
def test_invalid_values_fail_with_readable_messages(sets: list[str], message: str) -> None:
    with pytest.raises(UserError) as err:
        render(*sets)
    assert message in str(err.value)


def test_prefix_match_unit_is_rendered_or_left_to_vllm() -> None:
    args = container(render(), "vllm")["args"]
    assert arg_after(args, "--prefix-match-unit") == "16"
    assert (
        "--prefix-match-unit"
        not in container(render("engine.prefixMatchUnit=null"), "vllm")["args"]
    )


@pytest.mark.parametrize("unit", [4, 12, 16, 20, 24, 48, 60, 80, 112])
def test_chart_accepts_a_prefix_match_unit_exactly_when_the_planner_does(unit: int) -> None:
    from dflash_ops.plan.planner import make_plan

    for k in (3, 5, 7, 8, 15):
        try:
            make_plan(CKPT, gpu="a100", tp=2, ks=[k], prefix_match_unit=unit)
            planner_ok = True
        except UserError:
            planner_ok = False
        sets = [f"engine.prefixMatchUnit={unit}", f"speculative.numSpeculativeTokens={k}"]
        try:
            rendered = arg_after(container(render(*sets), "vllm")["args"], "--prefix-match-unit")
            chart_ok = rendered == str(unit)
        except UserError as err:
            assert "engine.prefixMatchUnit" in str(err)
            chart_ok = False
        assert chart_ok == planner_ok, (unit, k)
