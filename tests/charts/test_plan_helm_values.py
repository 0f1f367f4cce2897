"""`dflash-serve plan --format helm-values` is read by its consumer, the chart: `helm template
-f` and `dflash-serve render -f` accept it and render the planned block size, k and method."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dflash_ops.chart.helm import engine_args_in_render, helm_template

from tests.conftest import REPO_ROOT


def plan(*argv: str, fmt: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "dflash_ops.cli", "plan", *argv, "--format", fmt],
        capture_output=True, text=True, check=True, cwd=REPO_ROOT,
    ).stdout  # fmt: skip


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def speculative_config(args: list[str], argv: list[str], k: int) -> dict[str, Any] | None:
    """The rendered --speculative-config, held to the planned method and k (none when off)."""
    spec = flag(args, "--speculative-config")
    method = flag(argv, "--method") or "dflash"
    if method == "off":
        assert spec is None
        return None
    assert spec is not None
    config: dict[str, Any] = json.loads(spec)
    assert (config["method"], config["num_speculative_tokens"]) == (method, k)
    return config


@pytest.mark.parametrize(
    "argv",
    [
        ["--gpu", "a100", "--tp", "2", "--k", "7"],
        ["--gpu", "h100", "--tp", "4", "--k", "5"],
        ["--gpu", "a100", "--tp", "2", "--k", "3", "--method", "mtp"],
        ["--gpu", "b200", "--tp", "8", "--k", "4", "--method", "ngram", "--kv-cache-dtype", "fp8"],
        ["--gpu", "a100", "--tp", "1", "--k", "7", "--prefix-match-unit", "0"],
        ["--gpu", "h200", "--tp", "2", "--k", "0", "--method", "off"],
    ],
    ids=["a100-k7", "h100-tp4-k5", "mtp3", "ngram-fp8", "no-unit", "off"],
)
def test_the_chart_renders_what_was_planned(tmp_path: Path, argv: list[str]) -> None:
    values = tmp_path / "planned.yaml"
    values.write_text(plan(*argv, fmt="helm-values"))
    k = int(flag(argv, "--k") or 7)
    want_block = str(json.loads(plan(*argv, fmt="json"))["recommended_block_size"][str(k)])
    # helm itself, and the CLI's render, accept the file as they would a user's values file.
    rendered = helm_template([values], [], "planned", "llm")
    cli = subprocess.run(
        [sys.executable, "-m", "dflash_ops.cli", "render", "-f", str(values)],
        capture_output=True, text=True, cwd=REPO_ROOT,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    for render in (rendered, cli.stdout):
        args = engine_args_in_render(render)
        assert flag(args, "--block-size") == want_block
        assert flag(args, "--tensor-parallel-size") == flag(argv, "--tp")
        speculative_config(args, argv, k)
        unit = flag(argv, "--prefix-match-unit")
        assert flag(args, "--prefix-match-unit") == (None if unit == "0" else unit or "16")
        assert (flag(args, "--kv-cache-dtype") or "auto") == (
            flag(argv, "--kv-cache-dtype") or "auto"
        )


@pytest.mark.parametrize(
    "argv",
    [
        ["--gpu", "h200", "--tp", "8", "--k", "7", "--draft-model", "my-org/glm-draft"],
        ["--gpu", "b200", "--tp", "2", "--k", "4", "--method", "ngram", "--weights-gib", "90"],
        [
            "--gpu",
            "h100",
            "--tp",
            "8",
            "--k",
            "0",
            "--method",
            "off",
            "--prefix-match-unit",
            "0",
            "--weights-gib",
            "40",
        ],
    ],
    ids=["h200-dflash", "b200-ngram", "h100-off"],
)
def test_the_chart_renders_what_was_planned_for_glm(tmp_path: Path, argv: list[str]) -> None:
    """GLM-5.3-Flash's planned values, merged with a user's file naming the checkpoint, render
    model.profile glm-5.3-flash with the planned block size, k and method."""
    glm = ["--model", "glm-5.3-flash", *argv]
    values = tmp_path / "planned.yaml"
    values.write_text(plan(*glm, fmt="helm-values"))
    mine = tmp_path / "mine.yaml"
    mine.write_text("model: {name: my-org/GLM-5.3-Flash, servedName: glm}\n")
    k = int(flag(argv, "--k") or 7)
    planned = json.loads(plan(*glm, fmt="json"))
    want_block = str(next(p for p in planned["plans"] if p["k"] == k)["recommended_block_size"])
    args = engine_args_in_render(helm_template([values, mine], [], "planned", "llm"))
    assert flag(args, "--block-size") == want_block
    assert flag(args, "--tensor-parallel-size") == flag(argv, "--tp")
    assert flag(args, "--reasoning-parser") == "glm45" and "--engram-config" not in args
    config = speculative_config(args, argv, k)
    assert config is None or config.get("model") == flag(argv, "--draft-model")
    unit = flag(argv, "--prefix-match-unit")
    assert flag(args, "--prefix-match-unit") == (None if unit == "0" else "16")
