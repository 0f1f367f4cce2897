"""NOTES.txt as `helm install` prints it: the KV capacity it quotes is the planner's for the
release's values, and the plan command it prints otherwise runs."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
from dflash_ops.chart.helm import helm_binary
from dflash_ops.cli import main
from dflash_ops.paths import CHART_DIR, PROFILES_DIR
from dflash_ops.plan.checkpoint import load_checkpoint
from dflash_ops.plan.planner import make_plan

CKPT = load_checkpoint()


def notes(*args: str) -> str:
    result = subprocess.run(
        [helm_binary(), "install", "t", str(CHART_DIR), "--dry-run=client", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.split("\nNOTES:\n", 1)[1]


@pytest.mark.parametrize(
    ("profile", "gpu", "tp", "method", "k"),
    [
        (None, "a100", 2, "dflash", 7),
        ("a100-tp2-mtp3", "a100", 2, "mtp", 3),
        ("h100-tp2-dflash2", "h100", 2, "dflash", 7),
        ("a100-2node-tp4-ray", "a100", 4, "dflash", 7),
        ("spec-off", "a100", 2, "off", 0),
    ],
)
def test_notes_quote_the_planners_capacity(
    profile: str | None, gpu: str, tp: int, method: str, k: int
) -> None:
    args = ["-f", str(PROFILES_DIR / f"{profile}.yaml")] if profile else []
    text = notes(*args)
    capacity = make_plan(
        CKPT,
        gpu=gpu,
        tp=tp,
        ks=[k],
        method=method,
        max_model_len=65536,
        utilization=0.9,  # type: ignore[arg-type]
    ).capacity[k]
    assert f"{capacity.kv_cache_tokens} tokens at max_model_len 65536" in text
    r = capacity.requests_at
    assert f"{r[8192]} of 8k, {r[32768]} of 32k, {r[65536]} of 64k tokens" in text


def test_other_values_get_the_plan_command_and_it_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = notes("--set", "model.maxModelLen=32768", "--set", "engine.kvCacheDtype=fp8")
    assert "KV cache per rank" not in text
    command = re.search(r"Capacity and concurrency for this layout: (.+)", text)
    assert command is not None
    argv = shlex.split(command.group(1))
    assert argv[:2] == ["dflash-serve", "plan"]
    assert main(argv[1:]) == 0
    out = capsys.readouterr().out
    assert "max_model_len 32,768" in out and "KV cache fp8" in out
    table = out[out.index("KV cache per rank") :]
    row = next(line.split() for line in table.splitlines() if line.startswith("7 "))
    assert row[-1] == "-"  # 64k requests are longer than max_model_len: none, not a number


def test_notes_without_a_matching_entry_never_shows_stale_figures(tmp_path: Path) -> None:
    values = tmp_path / "v.yaml"
    values.write_text("model:\n  gpuMemoryUtilization: 0.85\n")
    assert "KV cache per rank" not in notes("-f", str(values))
