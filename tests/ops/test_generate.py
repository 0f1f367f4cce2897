"""`make generate-check`: every committed generated file equals what its generator makes now
(dashboards, the chart's block-size and KV-capacity tables, the rendered examples, the schema's
planner limits, the plan quotes in docs/planning.md, the patch manifest)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from dflash_ops import generate

from tests.conftest import REPO_ROOT


def test_every_generated_file_is_current() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dflash_ops.generate", "--check"],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_check_names_a_stale_file_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stale, current = tmp_path / "stale.json", tmp_path / "current.json"
    stale.write_text("old\n")
    current.write_text("same\n")
    monkeypatch.setattr(generate, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(
        generate,
        "targets",
        lambda: [
            generate.Generated(stale, lambda: "new\n"),
            generate.Generated(current, lambda: "same\n"),
        ],
    )
    assert generate.main(["--check"]) == 1
    assert "stale generated files: stale.json" in capsys.readouterr().err
    assert stale.read_text() == "old\n"
    assert generate.main([]) == 0
    assert stale.read_text() == "new\n" and current.read_text() == "same\n"
