"""GLM-5.3-Flash in the planner without vLLM: the closed form's figures and invariants, and the
one-line refusals of what vLLM 0.33.0 would refuse or what is not planned for it yet. Its KV
cache: tests/ops/plan/test_glm5_next_capacity.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from dflash_ops.plan import glm5_next
from dflash_ops.plan.glm5_next import load_glm5_next, plan_block_size, reference_config_path
from dflash_ops.plan.model import BlockSizeInputs
from hypothesis import given
from hypothesis import strategies as st

CONFIG = reference_config_path()
CKPT = load_glm5_next()


def test_the_reference_figures_by_hand() -> None:
    """H100, TP2, k=0: the KDA state is q, k, v (3 x 64 heads x 128 / 2 ranks) over 3 conv rows
    in bfloat16 plus 32 x 128 x 128 float32; the latent page 512 x 2 bytes; blocks on the
    indexer's 32-entry pages of 16 tokens."""
    plan = plan_block_size(CKPT, BlockSizeInputs(gpu="h100", tp=2, k=0))
    assert plan.kda_state_bytes == 3 * 64 * 128 // 2 * 3 * 2 + 32 * 128 * 128 * 4 == 2_170_880
    assert plan.mla_page_bytes_per_token == 1024 and plan.kernel_alignment == 512
    assert plan.automatic_block_size == 2560  # 512 x ceil(2,170,880 / (512 x 1024))
    assert plan.tail_ring == 16 and plan.automatic_is_valid and plan.recommended_block_size == 2560


def test_b200_runs_an_automatic_kv_cache_in_fp8() -> None:
    plan = plan_block_size(CKPT, BlockSizeInputs(gpu="b200", tp=2, k=7))
    assert plan.effective_kv_cache_dtype == "fp8" and plan.mla_page_bytes_per_token == 512
    assert plan.sparse_mla_backend == "FLASHINFER_MLA_SPARSE"
    assert plan.automatic_block_size == 4608  # 512 x ceil(2,342,912 / (512 x 512))
    dense = plan_block_size(CKPT, BlockSizeInputs(gpu="b200", tp=2, k=7, kv_cache_dtype="bfloat16"))
    assert dense.effective_kv_cache_dtype == "bfloat16" and dense.automatic_block_size == 2560


@given(
    gpu=st.sampled_from(glm5_next.SPARSE_MLA_GPUS),
    tp=st.sampled_from((1, 2, 4, 8)),
    k=st.integers(0, 15),
    kv=st.sampled_from(("auto", "bfloat16", "fp8")),
)
def test_the_block_is_the_smallest_on_the_grid_that_holds_the_state(
    gpu: str, tp: int, k: int, kv: str
) -> None:
    plan = plan_block_size(CKPT, BlockSizeInputs(gpu=gpu, tp=tp, k=k, kv_cache_dtype=kv))  # type: ignore[arg-type]
    block, page, state = (
        plan.automatic_block_size,
        plan.mla_page_bytes_per_token,
        plan.kda_state_bytes,
    )
    assert block % plan.kernel_alignment == 0
    assert block * page >= state > (block - plan.kernel_alignment) * page
    # The tail ring never exceeds 32 tokens for k <= 15: every block starts unpatched.
    assert plan.tail_ring in (16, 32) and plan.automatic_is_valid
    assert plan.recommended_block_size == block


def plan_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dflash_ops.cli", "plan", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_cli_plans_the_bundled_config_and_a_checkpoint_directory(tmp_path: Path) -> None:
    table = plan_cli("--model", "glm-5.3-flash", "--gpu", "h100", "--k", "0-2",
                     "--weights-gib", "30", "--engine", "closed-form")  # fmt: skip
    assert table.returncode == 0, table.stderr
    assert "GLM-5.3-Flash" in table.stdout and "--prefix-match-unit 16" in table.stdout
    assert "KV cache per rank" in table.stdout and "GLM-5.3-Flash-DFlash2" in table.stdout
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Glm5NextForConditionalGeneration"],
                "model_type": "glm5_next",
                "text_config": json.loads(CONFIG.read_text()),
            }
        )
    )
    out = plan_cli("--config", str(tmp_path), "--gpu", "b200", "--k", "7", "--format", "json",
                   "--weights-gib", "30", "--engine", "closed-form")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["plans"][0]["automatic_block_size"] == 4608


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--gpu", "a100"), "no sparse MLA backend"),
        (
            ("--gpu", "h100", "--tp", "3"),
            "valid tensor-parallel sizes for GLM-5.3-Flash: 1, 2, 4, 8",
        ),
        (
            ("--gpu", "h100", "--format", "helm-values"),
            "helm-values with --method dflash needs --draft-model",
        ),
        (
            (
                "--gpu",
                "h100",
                "--weights-gib",
                "30",
                "--k",
                "3-4",
                "--draft-model",
                "x/y",
                "--format",
                "helm-values",
            ),
            "describes one deployment: pass one --k",
        ),
        (("--gpu", "h100", "--method", "mtp"), "planned for GLM-5.3-Flash are dflash, ngram, off"),
        (("--gpu", "h100"), "no memory is left for the KV cache: 80 GiB x"),
        (("--gpu", "h100", "--weights-gib", "30", "--weights-from", "/nonexistent"), "not both"),
        (("--gpu", "h100", "--schedule", "1-4:7"), "leave --schedule out"),
        (
            ("--gpu", "h100", "--weights-gib", "30", "--prefix-match-unit", "8"),
            "multiple of the DSA indexer's pool (index_kpool) 16",
        ),
    ],
)
def test_refusals_are_one_line(args: tuple[str, ...], says: str) -> None:
    done = plan_cli("--model", "glm-5.3-flash", "--engine", "closed-form", *args)
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_a_config_of_the_other_model_is_refused() -> None:
    done = plan_cli("--model", "qwen3.8-flash-next", "--config", str(CONFIG), "--gpu", "h100")
    assert done.returncode == 2 and "is GLM-5.3-Flash" in done.stderr, done.stderr
    qwen = str(CONFIG.with_name("qwen3.8-flash-next.config.json"))
    done = plan_cli("--model", "glm-5.3-flash", "--config", qwen, "--gpu", "h100")
    assert done.returncode == 2 and "is qwen4_exp" in done.stderr, done.stderr


def test_a_config_whose_text_config_is_no_object_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"text_config": 5}')
    done = plan_cli("--config", str(tmp_path), "--engine", "closed-form")
    assert done.returncode == 2 and "model_type None is not supported" in done.stderr
    assert "Traceback" not in done.stderr
