"""The paying pair on a real vLLM CPU engine, started as a user starts it (`local up --models
paying`): served under its name, a draft of the target's first layers accepted like a real draft
(high at the first position, decaying by position). Its speed-up over `off` is benchmark output
(README "A model pair where speculation pays"), not a timed test."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from dflash_ops.local import stack
from dflash_ops.local.paying_model import parameter_count
from dflash_ops.loopback import free_port

pytestmark = pytest.mark.e2e


def cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dflash_ops.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def paying_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    state_dir = tmp_path_factory.mktemp("paying")
    engine_port = free_port()
    started = cli(
        "local", "up", "--models", "paying", "--k", "4", "--enforce-eager", "--no-prometheus",
        "--state-dir", str(state_dir), "--engine-port", str(engine_port),
        "--sidecar-port", str(free_port()),
    )  # fmt: skip
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        yield state_dir, f"http://127.0.0.1:{engine_port}"
    finally:
        stack.down(state_dir, quiet=True)


def test_the_pair_is_served_under_its_name_with_a_draft_a_fraction_of_the_target(
    paying_stack: tuple[Path, str],
) -> None:
    state_dir, url = paying_stack
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as reply:
        assert [m["id"] for m in json.load(reply)["data"]] == ["paying"]
    models = state_dir / "models"
    target, draft = (
        parameter_count(models / "paying-target"),
        parameter_count(models / "paying-draft"),
    )
    assert 100e6 <= target <= 300e6 and draft <= target / 4, (target, draft)
    log = (state_dir / "engine.log").read_text()
    assert "draft_model" in log and "bfloat16" in log


def test_the_draft_is_accepted_like_a_real_draft(
    paying_stack: tuple[Path, str], tmp_path: Path
) -> None:
    _, url = paying_stack
    run = cli(
        "bench", "--base-url", url, "--concurrency", "1", "--num-requests", "4",
        "--repeats", "1", "--max-tokens", "64", "--temperature", "0", "--ignore-eos",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "results.json").read_text())
    spec = result["levels"][0]["spec_decode"]
    rates = spec["per_position_acceptance"]
    assert len(rates) == 4
    # Decaying by position, as a real draft's acceptance does, and far from the tiny pair's
    # noise draft: the first layers decide most next tokens.
    assert all(a > b for a, b in itertools.pairwise(rates)), rates
    assert rates[0] > 0.5 and rates[-1] > 0.05, rates
    assert spec["mean_acceptance_length"] > 2.0, spec
