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


def test_out_of_range_target_layers_are_named(
    patched_vllm: Path, run_probe: ProbeRunner, tmp_path: Path
) -> None:
    draft = draft_variant(tmp_path, target_layer_ids=[5, 15, 25, 35, 48])
    result = run_probe(patched_vllm, "config-gate", draft)
    assert not result["accepted"]
    assert "asks for aux layer ids [6, 16, 26, 36, 49]" in result["error"]
    assert "[49] fall outside 0..48" in result["error"]
    assert draft in result["error"]


@pytest.mark.parametrize(
    ("ids", "aux"),
    [([5, 15, 25, 25, 45], "[6, 16, 26, 26, 46]"), ([15, 5, 25, 35, 45], "[16, 6, 26, 36, 46]")],
    ids=["duplicate", "unsorted"],
)
def test_target_layers_must_be_strictly_increasing(
    patched_vllm: Path, run_probe: ProbeRunner, tmp_path: Path, ids: list[int], aux: str
) -> None:
    # The model sorts and dedups its capture ids: a duplicate would give 4 features against a
    # 12800-wide fc, and unsorted ids would silently reorder the features.
    result = run_probe(patched_vllm, "config-gate", draft_variant(tmp_path, target_layer_ids=ids))
    assert not result["accepted"]
    assert f"asks for aux layer ids {aux}, which must be strictly increasing" in result["error"]


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
    assert "names no target layers" in result["error"]
