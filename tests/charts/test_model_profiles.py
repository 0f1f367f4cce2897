"""The chart's model.profile: GLM-5.3-Flash renders the planner's block size and its own parsers
and flags, refuses what vLLM 0.33.0 would refuse by name, and every Qwen3.8-Flash-Next render is
the one it was before profiles (the committed examples, regenerated and compared, hold that)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from dflash_ops.chart.helm import engine_args_in_render, helm_template
from dflash_ops.errors import UserError
from dflash_ops.model_profiles import PROFILES, chart_profiles, profile_of_model_type
from dflash_ops.paths import CHART_DIR, PROFILES_DIR
from dflash_ops.plan import glm5_next
from dflash_ops.plan.checkpoint import SUPPORTED_MODEL_TYPES, load_checkpoint
from dflash_ops.plan.draft import draft_profile_from_config
from dflash_ops.plan.glm5_next_capacity import default_glm_dflash2_profile
from dflash_ops.plan.gpus import GPUS
from dflash_ops.plan.model import BlockSizeInputs
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.charts.conftest import arg_after
from tests.conftest import REPO_ROOT

GLM = PROFILES_DIR / "h200-tp8-glm-5.3-flash.yaml"
GLM_CKPT = glm5_next.load_glm5_next()


def glm_args(*sets: str) -> list[str]:
    return engine_args_in_render(helm_template([GLM], list(sets), "t", "llm"))


def refusal(*sets: str, values: list[Path] | None = None) -> str:
    """helm's error for these values (rendering must fail): one error, naming the value."""
    with pytest.raises(UserError) as failed:
        helm_template(values if values is not None else [GLM], list(sets), "t", "llm")
    said = str(failed.value)
    assert len([line for line in said.splitlines() if "Error" in line]) == 1, said
    return said


def test_glm_renders_its_parsers_and_no_qwen_only_flag() -> None:
    args = glm_args()
    assert arg_after(args, "--reasoning-parser") == "glm45"
    assert arg_after(args, "--tool-call-parser") == "glm47"
    assert "--engram-config" not in args
    assert arg_after(args, "--prefix-match-unit") == "16"
    spec = json.loads(arg_after(args, "--speculative-config"))
    assert spec == {
        "method": "dflash",
        "model": "your-org/GLM-5.3-Flash-DFlash2",
        "num_speculative_tokens": 7,
    }
    none = glm_args("model.reasoningParser=", "model.toolCallParser=")
    assert "--reasoning-parser" not in none and "--tool-call-parser" not in none


@settings(max_examples=20, deadline=None)
@given(
    gpu=st.sampled_from(glm5_next.SPARSE_MLA_GPUS),
    tp=st.sampled_from((1, 2, 4, 8)),
    kv=st.sampled_from(("auto", "fp8")),
    k=st.integers(1, 15),
)
def test_glm_renders_the_planners_block_size(gpu: str, tp: int, kv: str, k: int) -> None:
    args = glm_args(
        f"gpu.type={gpu}",
        f"engine.tensorParallelSize={tp}",
        f"engine.kvCacheDtype={kv}",
        f"speculative.numSpeculativeTokens={k}",
    )
    plan = glm5_next.plan_block_size(
        GLM_CKPT,
        BlockSizeInputs(gpu=gpu, tp=tp, kv_cache_dtype=kv, k=k),  # type: ignore[arg-type]
    )
    assert int(arg_after(args, "--block-size")) == plan.recommended_block_size


def test_a_given_block_size_is_held_to_glms_rule() -> None:
    # H200 TP8 k7: the block holds the KDA state at 1024; the grid is the indexer's 512.
    assert arg_after(glm_args("engine.blockSize=1536"), "--block-size") == "1536"
    said = refusal("engine.blockSize=1000")
    assert "engine.blockSize 1000 would fail at startup" in said and "Use 1024" in said


@pytest.mark.parametrize(
    ("sets", "says"),
    [
        (("gpu.type=a100",),
         'gpu.type "a100" is not supported for model.profile glm-5.3-flash: its attention is '
         "sparse MLA"),
        (("speculative.method=mtp",),
         "speculative.method mtp is not served for model.profile glm-5.3-flash: use dflash, "
         "ngram, off"),
        (("model.name=Qwen/Qwen3.8-Flash-Next-AWQ",),
         "model.name Qwen/Qwen3.8-Flash-Next-AWQ is Qwen3.8-Flash-Next's checkpoint"),
        (("speculative.draftModel=incoai/Qwen3.8-Flash-Next-DFlash2",),
         "is Qwen3.8-Flash-Next's DFlash2 draft and model.profile is glm-5.3-flash"),
        (("engine.prefixMatchUnit=8",),
         "multiple of the DSA indexer's pool (index_kpool) 16"),
        (("engine.tensorParallelSize=3",), "tensorParallelSize"),
    ],
)  # fmt: skip
def test_glm_refusals_name_the_value(sets: tuple[str, ...], says: str) -> None:
    assert says in refusal(*sets)


def test_the_qwen_defaults_render_as_before() -> None:
    """The profile and the parsers spelled out give the default render byte for byte (every
    Qwen3.8-Flash-Next example is the committed one: test_profiles_and_schemas regenerates
    them)."""
    explicit = helm_template(
        [],
        [
            "model.profile=qwen3.8-flash-next",
            "model.reasoningParser=qwen3",
            "model.toolCallParser=qwen3_xml",
        ],
        "t",
        "llm",
    )
    assert explicit == helm_template([], [], "t", "llm")


def test_the_chart_reads_the_profiles_the_planner_has() -> None:
    on_disk = yaml.safe_load((CHART_DIR / "files" / "model-profiles.yaml").read_text())
    assert on_disk == chart_profiles()
    glm, qwen = PROFILES["glm-5.3-flash"], PROFILES["qwen3.8-flash-next"]
    assert glm.gpus == tuple(sorted(glm5_next.SPARSE_MLA_GPUS))
    assert qwen.gpus == tuple(sorted(GPUS))
    assert glm.model_types == glm5_next.MODEL_TYPES
    assert qwen.model_types == SUPPORTED_MODEL_TYPES
    # The prefix-hit grain is the model's compressed state: QSA's ratio, the indexer's pool.
    assert qwen.prefix_match_multiple == load_checkpoint().indexer_compress_ratio
    assert glm.prefix_match_multiple == GLM_CKPT.index_kpool
    assert profile_of_model_type("glm5_next_text") is glm
    assert profile_of_model_type("llama") is None
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    assert schema["properties"]["model"]["properties"]["profile"]["enum"] == list(PROFILES)


def test_the_glm_draft_fixture_is_the_layout_the_planner_assumes() -> None:
    path = REPO_ROOT / "tests" / "patches" / "fixtures" / "glm-dflash2-draft" / "config.json"
    fixture = draft_profile_from_config(json.loads(path.read_text()), "fixture")
    assumed = default_glm_dflash2_profile()
    same = ("layer_kinds", "sliding_window", "num_key_value_heads", "head_dim")
    assert {f: getattr(fixture, f) for f in same} == {f: getattr(assumed, f) for f in same}
    config = json.loads(path.read_text())
    assert config["hidden_size"] == GLM_CKPT.hidden_size
    assert max(config["dflash_config"]["target_layer_ids"]) < GLM_CKPT.num_hidden_layers
