"""Patch 0002 through vLLM's own config code: a real VllmConfig with a DFlash2 draft."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT
from tests.patches.conftest import ProbeRunner

pytestmark = pytest.mark.vllm033

DRAFT = REPO_ROOT / "tests" / "patches" / "fixtures" / "dflash2-draft"


def draft_variant(tmp_path: Path, **changes: Any) -> str:
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = json.loads((DRAFT / "config.json").read_text())
    for key, value in changes.items():
        if key == "target_layer_ids":
            config["dflash_config"]["target_layer_ids"] = value
        else:
            config[key] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_unpatched_vllm_rejects_dflash(run_probe: ProbeRunner) -> None:
    result = run_probe(None, "config-gate", str(DRAFT))
    assert not result["accepted"]
    assert "supports only its native MTP" in result["error"]


def test_patched_vllm_names_a_method_it_rejects(patched_vllm: Path, run_probe: ProbeRunner) -> None:
    result = run_probe(patched_vllm, "method-gate", "eagle3")
    assert not result["accepted"]
    assert (
        "MTP checkpoint, linear n-gram proposers and DFlash drafts, not 'eagle3'"
        in (result["error"])
    )


def test_patched_vllm_accepts_the_dflash2_draft(patched_vllm: Path, run_probe: ProbeRunner) -> None:
    result = run_probe(patched_vllm, "config-gate", str(DRAFT))
    assert result == {"accepted": True, "method": "dflash", "mamba_ssm_cache_dtype": "float32"}


def test_out_of_range_target_layers_are_named_as_written(
    patched_vllm: Path, run_probe: ProbeRunner, tmp_path: Path
) -> None:
    """A typo'd 48 is reported as 48 (vLLM adds 1 to DFlash ids internally)."""
    draft = draft_variant(tmp_path, target_layer_ids=[5, 15, 25, 35, 48])
    result = run_probe(patched_vllm, "config-gate", draft)
    assert not result["accepted"]
    assert (
        f"DFlash draft {draft}: dflash_config.target_layer_ids [5, 15, 25, 35, 48] must lie "
        "in 0..47 (Qwen4Exp has 48 layers); [48] do not." in result["error"]
    )


def test_eagle_style_aux_ids_name_layer_inputs(
    patched_vllm: Path, run_probe: ProbeRunner, tmp_path: Path
) -> None:
    """`eagle_aux_hidden_state_layer_ids` take precedence, with Eagle semantics (0..48)."""
    ok = draft_variant(tmp_path / "ok", eagle_aux_hidden_state_layer_ids=[6, 16, 26, 36, 48])
    assert run_probe(patched_vllm, "config-gate", ok)["accepted"]
    bad = draft_variant(tmp_path / "bad", eagle_aux_hidden_state_layer_ids=[6, 16, 26, 36, 49])
    result = run_probe(patched_vllm, "config-gate", bad)
    assert (
        "eagle_aux_hidden_state_layer_ids [6, 16, 26, 36, 49] must lie in 0..48"
        in (result["error"])
    )


@pytest.mark.parametrize(
    "ids", [[5, 15, 25, 25, 45], [15, 5, 25, 35, 45]], ids=["duplicate", "unsorted"]
)
def test_target_layers_must_be_strictly_increasing(
    patched_vllm: Path, run_probe: ProbeRunner, tmp_path: Path, ids: list[int]
) -> None:
    # The model captures each layer once, in order: a duplicate would give 4 features against
    # a 12800-wide fc, and unsorted ids would silently reorder the features.
    result = run_probe(patched_vllm, "config-gate", draft_variant(tmp_path, target_layer_ids=ids))
    assert not result["accepted"]
    assert f"dflash_config.target_layer_ids {ids} must be strictly increasing" in result["error"]


def test_target_layers_must_be_integers(
    patched_vllm: Path, run_probe: ProbeRunner, tmp_path: Path
) -> None:
    draft = draft_variant(tmp_path, target_layer_ids=[5, 15, "25", 35, 45])
    result = run_probe(patched_vllm, "config-gate", draft)
    assert "must be integers" in result["error"]


def test_sync_check_the_config_gate_imports_no_worker_code(patched_vllm: Path) -> None:
    """A sync check: config code must not pull in GPU-worker modules (semantics above)."""
    source = (patched_vllm / "vllm" / "model_executor" / "models" / "config.py").read_text()
    gate = source[source.index("def _verify_qwen4_exp_dflash_draft") :]
    gate = gate[: gate.index("\ndef ")]
    assert "vllm.v1.worker" not in gate and "import" not in gate


def test_wrong_feature_width_is_named(
    patched_vllm: Path, run_probe: ProbeRunner, tmp_path: Path
) -> None:
    draft = draft_variant(tmp_path, target_hidden_size=2048)
    result = run_probe(patched_vllm, "config-gate", draft)
    assert not result["accepted"]
    assert "5 x 2048 = 10240" in result["error"]
    assert "5 x hidden_size 2560 = 12800" in result["error"]


def test_draft_without_target_layers_is_rejected(
    patched_vllm: Path, run_probe: ProbeRunner, tmp_path: Path
) -> None:
    draft = draft_variant(tmp_path, target_layer_ids=[])
    result = run_probe(patched_vllm, "config-gate", draft)
    assert not result["accepted"]
    assert "dflash_config.target_layer_ids is missing or empty" in result["error"]
