"""The model-download init container's script (files/model-download/download-models.py), run
with the real huggingface_hub against a cache laid out as the hub writes it (no network: the hub
in offline mode serves what the cache holds, as on a restart after a complete download)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dflash_ops.paths import CHART_DIR

SCRIPT = CHART_DIR / "files" / "model-download" / "download-models.py"


def run(hf_home: Path, *models: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_TOKEN", None)
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--report-seconds", "0.05", *models],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def cache_snapshot(hf_home: Path, repo: str, files: dict[str, str]) -> None:
    revision = "0" * 40
    folder = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(revision)
    snapshot = folder / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for name, text in files.items():
        (snapshot / name).write_text(text)


def test_a_complete_cache_is_not_fetched_again_and_paths_are_skipped(tmp_path: Path) -> None:
    cache_snapshot(tmp_path, "org/model", {"config.json": "{}"})
    result = run(tmp_path, "org/model", "/models/local-weights")
    assert result.returncode == 0, result.stderr
    assert "org/model: complete" in result.stdout
    assert "/models/local-weights: a path, not a hub id: skipped" in result.stdout


def test_a_failed_download_names_the_model_and_exits_nonzero(tmp_path: Path) -> None:
    result = run(tmp_path, "org/missing-model")
    assert result.returncode == 1
    assert "[model-download] org/missing-model: failed:" in result.stderr
    assert "Traceback" not in result.stderr
    assert "org/missing-model: downloading into" in result.stdout
