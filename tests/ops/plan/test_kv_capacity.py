"""The KV capacity planner (closed form): the seed's table, the accounting, bad input.

The same figures from vLLM 0.33.0's own planning code: test_kv_capacity_engines_agree.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dflash_ops.cli import main
from dflash_ops.errors import UserError
from dflash_ops.plan import closed_form, kv_capacity_closed_form
from dflash_ops.plan.checkpoint import load_checkpoint
from dflash_ops.plan.draft import (
    DEFAULT_DFLASH2_CONFIG,
    default_dflash2_profile,
    draft_profile_from_config,
    load_draft_profile,
)
from dflash_ops.plan.kv_capacity import CapacityInputs, layer_inventory
from dflash_ops.plan.model import BlockSizeInputs
from dflash_ops.plan.planner import make_plan
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.ops.plan.capacity_seed import (
    SEED_DFLASH_K3,
    SEED_DFLASH_K7,
    SEED_MTP_K3,
    blocks_for,
    calibrated,
    default_inputs,
    seed_run,
)

CKPT = load_checkpoint()
ENGINE = kv_capacity_closed_form.kv_capacity


def test_k7_over_k3_is_the_seeds_ratio() -> None:
    inputs, k3 = calibrated(ENGINE)
    k7 = seed_run(ENGINE, "dflash", 7, inputs)
    assert k7.kv_cache_tokens / k3.kv_cache_tokens == pytest.approx(
        SEED_DFLASH_K7 / SEED_DFLASH_K3, rel=0.01
    )
    assert k7.kv_cache_tokens == pytest.approx(SEED_DFLASH_K7, rel=0.01)


def test_one_budget_logs_both_seed_figures_exactly() -> None:
    """The accounting, not only the ratio: the seed's k=3 and k=7 figures are each some pool
    size over this plan's blocks per request, and one byte budget yields both pools."""
    inputs = default_inputs(CKPT, "dflash")
    k3 = seed_run(ENGINE, "dflash", 3, inputs)
    k7 = seed_run(ENGINE, "dflash", 7, inputs)
    pools = {}
    for figure, run in ((SEED_DFLASH_K3, k3), (SEED_DFLASH_K7, k7)):
        per_request = sum(run.blocks_per_request.values())
        blocks = blocks_for(figure, per_request, inputs.max_model_len)
        pools[run.k] = (blocks * run.bytes_per_block, (blocks + 1) * run.bytes_per_block)
    low = max(start for start, _ in pools.values())
    high = min(end for _, end in pools.values())
    assert low < high, pools
    assert k3.blocks_per_request == {"attention": 164, "ring": 1, "mamba": 20, "draft": 5}
    assert k7.blocks_per_request == {"attention": 157, "ring": 1, "mamba": 36, "draft": 5}


def test_mtp3_is_below_dflash_k3_and_near_the_seed_with_its_weights() -> None:
    inputs, k3 = calibrated(ENGINE)
    mtp_inputs = default_inputs(CKPT, "mtp").model_copy(
        update={"target_weights_gib": inputs.target_weights_gib}
    )
    mtp = seed_run(ENGINE, "mtp", 3, mtp_inputs)
    same_budget = seed_run(ENGINE, "mtp", 3, inputs)
    # One more QSA layer widens every block; no draft group.
    assert mtp.groups == {"attention": 1, "ring": 1, "mamba": 4, "draft": 0}
    assert mtp.bytes_per_block == k3.bytes_per_block * 13 // 12
    assert same_budget.kv_cache_tokens < k3.kv_cache_tokens
    assert mtp.kv_cache_tokens < same_budget.kv_cache_tokens  # the MTP module's own weights
    assert mtp.kv_cache_tokens == pytest.approx(SEED_MTP_K3, rel=0.02)


def test_capacity_falls_with_k_and_mamba_blocks_grow_by_groups() -> None:
    plan = make_plan(CKPT, gpu="a100", tp=2, ks=list(range(1, 16)), engine="closed-form")
    tokens = [plan.capacity[k].kv_cache_tokens for k in range(1, 16)]
    assert tokens == sorted(tokens, reverse=True)
    for k in range(1, 16):
        capacity = plan.capacity[k]
        assert capacity.groups["mamba"] == 4  # 36 GDN layers in 3 groups of 12, the PLE layer
        assert capacity.blocks_per_request["mamba"] == 4 * (2 + k)
        assert capacity.mamba_state_bytes_per_request == 4 * (2 + k) * capacity.bytes_per_block


def test_hopper_adds_a_prefill_checkpoint_block_per_mamba_group() -> None:
    a100 = make_plan(CKPT, gpu="a100", tp=2, ks=[7], engine="closed-form").capacity[7]
    h100 = make_plan(CKPT, gpu="h100", tp=2, ks=[7], engine="closed-form").capacity[7]
    assert a100.blocks_per_request["mamba"] == 4 * 9
    assert h100.blocks_per_request["mamba"] == 4 * 10


def test_sliding_window_draft_holds_its_window_and_the_tokens_in_flight() -> None:
    inputs = default_inputs(CKPT, "dflash")
    assert inputs.async_scheduling and inputs.max_in_flight_tokens == 2 * 2048
    run = seed_run(ENGINE, "dflash", 7, inputs)
    assert run.blocks_per_request["draft"] == -(-(2048 - 1 + 4096) // 1680) + 1
    synchronous = inputs.model_copy(update={"async_scheduling": False})
    assert seed_run(ENGINE, "dflash", 7, synchronous).blocks_per_request["draft"] == 4
    short = inputs.model_copy(update={"max_model_len": 1000, "context_lengths": (1000,)})
    assert seed_run(ENGINE, "dflash", 7, short).blocks_per_request["draft"] == 2


def test_a_full_attention_draft_joins_the_attention_group() -> None:
    config = dict(DEFAULT_DFLASH2_CONFIG, layer_types=None)
    draft = draft_profile_from_config(config, "test")
    assert draft.layer_kinds == ("full",) * 5 and draft.sliding_window is None
    kinds = [layer.kind for layer in layer_inventory(CKPT, "dflash", draft)]
    assert kinds.count("draft_full") == 5
    plan = closed_form.plan_block_size(CKPT, BlockSizeInputs(gpu="a100", tp=2, k=7))
    run = ENGINE(CKPT, plan, method="dflash", draft=draft, inputs=default_inputs(CKPT, "dflash"))
    assert run.groups["draft"] == 0
    assert run.blocks_per_request["draft"] == 0
    sliding = seed_run(ENGINE, "dflash", 7, default_inputs(CKPT, "dflash"))
    assert run.bytes_per_block > sliding.bytes_per_block  # the draft layers widen the block


def test_draft_profile_follows_vllms_layer_rule(tmp_path: Path) -> None:
    swa = dict(DEFAULT_DFLASH2_CONFIG, layer_types=None, dflash_config={"use_swa": True})
    assert draft_profile_from_config(swa, "t").layer_kinds == ("sliding",) * 5
    mixed = dict(
        DEFAULT_DFLASH2_CONFIG, num_hidden_layers=2, layer_types=["sliding_attention", "x"]
    )
    assert draft_profile_from_config(mixed, "t").layer_kinds == ("sliding", "full")
    no_window = dict(DEFAULT_DFLASH2_CONFIG)
    del no_window["sliding_window"]
    with pytest.raises(UserError, match=r"dflash_config\.swa_window_size or sliding_window"):
        draft_profile_from_config(no_window, "t")
    with pytest.raises(UserError, match="layer_types has 5 entries for 3 layers"):
        draft_profile_from_config(dict(DEFAULT_DFLASH2_CONFIG, num_hidden_layers=3), "t")
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(UserError, match="not valid JSON"):
        load_draft_profile(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(DEFAULT_DFLASH2_CONFIG))
    assert load_draft_profile(tmp_path).weights_bytes == default_dflash2_profile().weights_bytes


def test_a_budget_too_small_for_one_request_names_the_length_that_fits() -> None:
    inputs = default_inputs(CKPT, "dflash").model_copy(update={"target_weights_gib": 66.5})
    run = seed_run(ENGINE, "dflash", 7, inputs)
    assert run.start_error is not None
    fits = int(run.start_error.split("--max-model-len ")[1].split()[0])
    for length, expect in ((fits, True), (fits + 1, False)):
        shorter = inputs.model_copy(update={"max_model_len": length})
        assert (seed_run(ENGINE, "dflash", 7, shorter).start_error is None) is expect, length


@settings(max_examples=60, deadline=None)
@given(
    budget_gib=st.floats(min_value=0.05, max_value=70),
    max_model_len=st.integers(min_value=1, max_value=1 << 20),
    batched=st.integers(min_value=1, max_value=1 << 16),
    lengths=st.lists(st.integers(min_value=1, max_value=1 << 20), min_size=1, max_size=4),
    k=st.integers(min_value=0, max_value=15),
    method=st.sampled_from(["dflash", "mtp", "ngram", "off"]),
)
def test_figures_are_possible_numbers(
    budget_gib: float,
    max_model_len: int,
    batched: int,
    lengths: list[int],
    k: int,
    method: str,
) -> None:
    k = 0 if method == "off" else max(k, 1)
    inputs = CapacityInputs(
        gpu_memory_gib=80,
        gpu_memory_utilization=1.0,
        target_weights_gib=80 - budget_gib,
        draft_weights_gib=0,
        profile_reserve_gib=0,
        max_model_len=max_model_len,
        max_num_batched_tokens=batched,
        async_scheduling=method != "ngram",
        context_lengths=tuple(sorted({*lengths, max_model_len})),
    )
    run = seed_run(ENGINE, method, k, inputs)
    per_request = sum(run.blocks_per_request.values())
    assert run.num_blocks == inputs.budget_bytes // run.bytes_per_block >= 0
    assert run.kv_cache_tokens == int(run.num_blocks / per_request * max_model_len) >= 0
    assert set(run.requests_at) == {n for n in inputs.context_lengths if n <= max_model_len}
    requests = [run.requests_at[n] for n in inputs.context_lengths if n in run.requests_at]
    assert all(r >= 0 for r in requests)
    assert requests == sorted(requests, reverse=True)  # longer requests never fit more
    at_max = run.requests_at[max_model_len]
    assert at_max == max(run.num_blocks - 1, 0) // per_request <= run.max_concurrency
    more = inputs.model_copy(update={"target_weights_gib": inputs.target_weights_gib - 1})
    assert seed_run(ENGINE, method, k, more).num_blocks >= run.num_blocks


def test_plan_table_shows_capacity_per_k_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--gpu", "a100", "--tp", "2", "--k", "3-8"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("KV cache per rank") :]
    header = next(line for line in table.splitlines() if line.startswith("k  block"))
    assert header.split()[-3:] == ["reqs@8k", "reqs@32k", "reqs@64k"]
    rows = [line.split() for line in table.splitlines() if line[:1].isdigit()]
    assert [row[0] for row in rows] == ["3", "4", "5", "6", "7", "8"]
    tokens = [int(row[8].replace(",", "")) for row in rows]
    assert tokens == sorted(tokens, reverse=True)
    assert "draft incoai/Qwen3.8-Flash-Next-DFlash2" in table and "assumed layout" in table


def test_plan_reads_the_draft_config_and_measures_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(
        json.dumps(dict(DEFAULT_DFLASH2_CONFIG, sliding_window=8192))
    )
    target = tmp_path / "target"
    target.mkdir()
    for i in range(2):
        with (target / f"model-{i}.safetensors").open("wb") as f:
            f.truncate(3 * 1024**3)
    argv = ["plan", "--k", "7", "--format", "json", "--draft-config", str(draft)]
    assert main([*argv, "--weights-from", str(target)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["capacity_assumptions"]["draft"]["sliding_window"] == 8192
    assert data["capacity_assumptions"]["inputs"]["target_weights_gib"] == pytest.approx(3.0)
    assert data["capacity"]["7"]["blocks_per_request"]["draft"] == -(-(8191 + 4096) // 1680) + 1
