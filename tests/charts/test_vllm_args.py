"""Every rendered engine command line, parsed by vLLM 0.33.0's own `vllm serve` parser and turned
into a real VllmConfig (speculative, Engram, parallel, cache configs) with the patch series."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dflash_ops.chart.helm import engine_args_in_render, helm_template
from dflash_ops.paths import PROFILES_DIR

from tests.conftest import REPO_ROOT
from tests.patches.conftest import manifest, patched_vllm, vllm_wheel  # noqa: F401

pytestmark = pytest.mark.vllm033

VARIANTS = {
    "ple-on-device": ["model.pleCpuOffload=false"],
    "fp8-kv": ["engine.kvCacheDtype=fp8"],
    "ngram": ["speculative.method=ngram", "speculative.numSpeculativeTokens=4"],
    "tp4": ["engine.tensorParallelSize=4"],
    "extra-args": ["model.extraArgs={--max-num-seqs=64}"],
    # A k per batch size, as a user sets it (helm --set splits on commas: ';' between ranges).
    "schedule": ["speculative.schedule=1-4:7;5-16:3;17-:0"],
    "schedule-mtp": ["speculative.method=mtp", "speculative.schedule=1-2:3;3-:1"],
}


def run_probe(tree: Path, cases: list[dict[str, Any]], tmp_path: Path) -> dict[str, str]:
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    result = subprocess.run(
        [sys.executable, "-m", "tests.charts.vllm_args_probe", str(path)],
        capture_output=True,
        text=True,
        env=os.environ | {"PYTHONPATH": f"{tree}{os.pathsep}{REPO_ROOT}"},
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_every_rendered_command_line_is_accepted_by_vllm_033(
    patched_vllm: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    cases = [
        {"name": p.stem, "argv": engine_args_in_render(helm_template([p], [], "dflash", "llm"))}
        for p in sorted(PROFILES_DIR.glob("*.yaml"))
    ]
    cases += [
        {"name": name, "argv": engine_args_in_render(helm_template([], sets, "dflash", "llm"))}
        for name, sets in VARIANTS.items()
    ]
    # The probe can fail: command lines vLLM 0.33.0 refuses, each for a different reason.
    good = cases[0]["argv"]
    spec_at = good.index("--speculative-config") + 1
    bad = {
        "bad-flag": [*good, "--ple-cpu-offload"],
        "bad-spec-key": [
            *good[:spec_at],
            json.dumps({**json.loads(good[spec_at]), "draft_layers": 5}),
            *good[spec_at + 1 :],
        ],
        "bad-engram": [*good, "--engram-config", '{"offload": true}'],
        "bad-schedule": [
            *good[:spec_at],
            json.dumps(
                {**json.loads(good[spec_at]), "num_speculative_tokens_per_batch_size": [[2, 4, 3]]}
            ),
            *good[spec_at + 1 :],
        ],
        "bad-tool-parser": [*good, "--tool-call-parser", "qwen3-xml"],
    }
    cases += [{"name": name, "argv": argv} for name, argv in bad.items()]
    results = run_probe(patched_vllm, cases, tmp_path)
    for name in bad:
        assert results.pop(name) != "ok", name
    assert results == dict.fromkeys(results, "ok")
