"""Planner facade and CLI: inputs, errors, output formats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dflash_ops.cli import main
from dflash_ops.errors import UserError
from dflash_ops.plan.checkpoint import load_checkpoint, reference_config_path
from dflash_ops.plan.planner import make_plan, parse_k


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(["plan", *argv])
    except SystemExit as exit_:  # argparse refuses a flag's value itself (exit 2)
        code = int(exit_.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_parse_k_accepts_values_and_ranges() -> None:
    assert parse_k("7") == [7]
    assert parse_k("4-8") == [4, 5, 6, 7, 8]


@pytest.mark.parametrize("bad", ["x", "8-4", "16", "-1", "3-99"])
def test_parse_k_rejects_bad_values(bad: str) -> None:
    with pytest.raises(UserError, match="--k"):
        parse_k(bad)


def test_json_names_recommended_block_size_per_k(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--gpu", "a100", "--tp", "2", "--k", "4-8", "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert data["recommended_block_size"] == {"4": 1616, "5": 1632, "6": 1632, "7": 1680, "8": 1680}
    assert [p["ring_capacity"] for p in data["plans"]] == [8, 12, 12, 12, 12]
    assert "--block-size" in data["vllm_args"]["7"]
    assert data["vllm_args"]["7"][data["vllm_args"]["7"].index("--block-size") + 1] == "1680"
    capacity = data["capacity"]["7"]
    assert capacity["block_size"] == 1680 and capacity["blocks_per_request"]["mamba"] == 4 * 9
    assert set(capacity["requests_at"]) == {"8192", "32768", "65536"}
    assert data["capacity_assumptions"]["draft"]["sliding_window"] == 2048


def test_table_shows_terms_and_args(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--k", "4-8")
    assert code == 0
    assert "QSA ring capacity" in out and "kernel alignment" in out
    assert "--block-size 1680" in out and "--mamba-cache-mode align" in out


def test_helm_values_need_one_k(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "--k", "3-5", "--format", "helm-values")
    assert code == 2 and "pass one --k (got 3: 3, 4, 5)" in err


def test_method_off_plans_k0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--method", "off", "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert list(data["recommended_block_size"]) == ["0"]
    assert "--speculative-config" not in data["vllm_args"]["0"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tp", "3"], "--tp 3 does not divide linear_num_key_heads=16"),
        (["--k", "20"], "--k '20'"),
        (["--config", "/nonexistent"], "not found"),
        (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization: '1.5': must be above 0"),
        (["--gpu-memory-utilization", "0"], "--gpu-memory-utilization: '0': must be above 0"),
        (["--max-model-len", "0"], "--max-model-len: '0': must be from 1 to 16777216"),
        (["--max-num-batched-tokens", "-5"], "--max-num-batched-tokens: '-5': must be from 1"),
        (["--profile-reserve-gib", "-1"], "--profile-reserve-gib: '-1': must be from 0 to 4096"),
        (["--draft-weights-gib", "-1"], "--draft-weights-gib: '-1': must be from 0 to 4096"),
        (["--context-lengths", "8k,x"], "--context-lengths '8k,x': expected token counts"),
        (["--context-lengths", "0"], "--context-lengths '0': lengths must be positive"),
        (["--weights-gib", "90"], "no memory is left for the KV cache"),
        (["--weights-from", "/nonexistent"], "--weights-from '/nonexistent': no *.safetensors"),
        (["--draft-config", "/nonexistent"], "--draft-config '/nonexistent' not found"),
        (["--weights-gib", "1", "--weights-from", "/x"], "not both"),
        (
            ["--k", "3", "--prefix-match-unit", "48"],
            "--prefix-match-unit 48 is not valid with block size 1600",
        ),
        (["--prefix-match-unit", "-16"], "--prefix-match-unit: '-16': must be from 0 to 1048576"),
    ],
)
def test_bad_input_is_one_clear_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_unknown_model_type_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(UserError, match="model_type 'llama' is not supported"):
        load_checkpoint(tmp_path)


def test_missing_field_is_named(tmp_path: Path) -> None:
    config = json.loads(reference_config_path().read_text())
    del config["text_config"]["indexer_compress_ratio"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="indexer_compress_ratio"):
        load_checkpoint(tmp_path / "config.json")


def test_engine_auto_falls_back_to_closed_form_without_vllm_033() -> None:
    plan = make_plan(load_checkpoint(), gpu="a100", tp=2, ks=[7])
    assert plan.engine == "closed-form"


def test_explicit_vllm_engine_without_vllm_033_fails_clearly() -> None:
    with pytest.raises(UserError, match=r"vllm==0\.33\.0"):
        make_plan(load_checkpoint(), gpu="a100", tp=2, ks=[7], engine="vllm")


def test_draft_weights_reduce_the_kv_capacity() -> None:
    ckpt = load_checkpoint()
    light = make_plan(ckpt, gpu="a100", tp=2, ks=[7], draft_weights_gib=0.5)
    heavy = make_plan(ckpt, gpu="a100", tp=2, ks=[7], draft_weights_gib=2.0)
    assert heavy.capacity[7].num_blocks < light.capacity[7].num_blocks
    assert heavy.capacity[7].kv_budget_gib_per_rank == pytest.approx(
        light.capacity[7].kv_budget_gib_per_rank - 1.5, abs=0.01
    )


def test_a_schedule_is_planned_for_its_largest_k_and_renders_as_the_chart_does(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from dflash_ops.chart.helm import engine_args_in_render, helm_template

    args = ["--gpu", "a100", "--tp", "2", "--k", "7", "--engine", "closed-form"]
    code, table, _ = run_cli(capsys, *args, "--schedule", "1-4:7;5-16:3;17-:0")
    assert code == 0
    assert "k schedule   1-4:7,5-16:3,17-:0" in table and "sized for k=7" in table
    code, plain, _ = run_cli(capsys, *args)
    assert code == 0  # the schedule changes neither the block size nor the KV capacity
    assert table.split("k schedule")[0] == plain.split("KV cache per rank")[0].rstrip("\n") + "\n"
    code, values, _ = run_cli(capsys, *args, "--schedule", "1-4:7,5-16:3,17-:0", "--format",
                              "helm-values")  # fmt: skip
    assert code == 0
    (tmp_path / "values.yaml").write_text(values)
    rendered = engine_args_in_render(helm_template([tmp_path / "values.yaml"], [], "r", "llm"))
    spec = json.loads(rendered[rendered.index("--speculative-config") + 1])
    code, out, _ = run_cli(capsys, *args, "--schedule", "1-4:7,5-16:3,17-:0", "--format", "json")
    planned = json.loads(out)["vllm_args"]["7"]
    assert json.loads(planned[planned.index("--speculative-config") + 1]) == spec
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 4, 7], [5, 16, 3], [17, 65536, 0]]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--k", "4-7", "--schedule", "1-4:3"], "--schedule goes with one --k"),
        (["--k", "4", "--schedule", "1-4:7"], "range 1-4 drafts 7: k must be 0"),
        (["--method", "off", "--schedule", "1-4:1"], "--schedule needs speculative decoding"),
        (["--k", "4", "--schedule", "soon"], "entry 'soon' is not FIRST-LAST:K"),
    ],
)
def test_a_schedule_that_cannot_run_is_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    code, out, err = run_cli(capsys, "--engine", "closed-form", *argv)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert says in line, line
