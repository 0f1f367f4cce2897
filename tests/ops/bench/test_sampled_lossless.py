"""The sampled lossless check through `dflash-serve bench`, against servers whose sampling is
known (tests/ops/bench/scripted_server.py, /markov/): one samples the chain exactly, one is a
broken speculative sampler from the second token on."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from dflash_ops.bench.core.client import Endpoint
from dflash_ops.bench.core.lossless import check_sampled_lossless
from dflash_ops.bench.core.results import SampledCheckSettings
from dflash_ops.bench.core.sampling import Sampling
from dflash_ops.cli import main
from dflash_ops.errors import UserError

SMALL = SampledCheckSettings(prompts=3, samples=300, tokens=4, alpha=0.002, permutations=199)


def check(ours: str, reference: str, sampling: Sampling) -> list:
    async def run() -> list:
        a, b = Endpoint(ours), Endpoint(reference)
        try:
            return await check_sampled_lossless(a, b, "fake", "fake", sampling, [1, 4], SMALL)
        finally:
            await a.aclose()
            await b.aclose()

    return asyncio.run(run())


def test_the_same_sampler_passes_at_every_concurrency(scripted_server: str) -> None:
    exact = f"{scripted_server}/markov/exact"
    checks = check(exact, exact, Sampling(temperature=1.0))
    assert [c.concurrency for c in checks] == [1, 4]
    assert all(c.passed and not c.findings for c in checks), checks
    # Bonferroni over the two concurrencies: each test runs at half the run's alpha.
    assert all(c.alpha == pytest.approx(0.001) for c in checks)
    assert checks[0].samples_per_side == 300 and checks[0].tokens == 4


def test_a_broken_speculative_sampler_fails_where_it_decides(scripted_server: str) -> None:
    checks = check(
        f"{scripted_server}/markov/sharp",
        f"{scripted_server}/markov/exact",
        Sampling(temperature=1),
    )
    assert not any(c.passed for c in checks)
    findings = [f for c in checks for f in c.findings]
    # The first token is sampled before anything is drafted: the broken sampler leaves it alone.
    assert findings and all(f.position >= 1 for f in findings), findings
    assert "with speculation" in findings[0].detail and "on the reference" in findings[0].detail


def test_greedy_runs_and_a_speculating_reference_are_refused(scripted_server: str) -> None:
    exact = f"{scripted_server}/markov/exact"
    with pytest.raises(UserError, match=r"run is greedy .* --check-lossless"):
        check(exact, exact, Sampling(temperature=0))
    with pytest.raises(UserError, match="counters: it serves with speculation"):
        check(exact, f"{scripted_server}/speculating", Sampling(temperature=1))


def bench(base_url: str, out: Path, *flags: str) -> int:
    return main(
        [
            "bench", "--base-url", base_url, "--out", str(out), "--concurrency", "1",
            "--num-prompts", "2", "--repeats", "1", "--warmup", "0", "--max-tokens", "4",
            "--lossless-concurrency", "2", "--sampled-lossless-prompts", "3",
            "--sampled-lossless-samples", "300", "--sampled-lossless-tokens", "4", *flags,
        ]
    )  # fmt: skip


def test_bench_exits_1_and_says_where_when_the_distributions_differ(
    scripted_server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exact = f"{scripted_server}/markov/exact"
    sharp = f"{scripted_server}/markov/sharp"
    assert (
        bench(exact, tmp_path / "same", "--temperature", "1", "--check-sampled-lossless", exact)
        == 0
    )
    same = json.loads((tmp_path / "same" / "results.json").read_text())
    assert same["sampled_lossless"][0]["p_value"] > 0.01
    assert (
        "Sampled losslessness: sampled outputs vs" in (tmp_path / "same" / "results.md").read_text()
    )
    capsys.readouterr()
    assert (
        bench(sharp, tmp_path / "sharp", "--temperature", "1", "--check-sampled-lossless", exact)
        == 1
    )
    err = capsys.readouterr().err
    assert "error: sampled outputs differ with speculation at concurrency 2" in err, err
    assert "position" in err.splitlines()[-1] and "Traceback" not in err
    md = (tmp_path / "sharp" / "results.md").read_text()
    assert ": FAIL, p = " in md and "adjusted p" in md


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--temperature", "0"], "run is greedy (--temperature 0)"),
        (
            ["--temperature", "1", "--sampled-lossless-samples", "5"],
            "--sampled-lossless-samples 5:",
        ),
        (["--temperature", "1", "--sampled-lossless-alpha", "1"], "--sampled-lossless-alpha 1.0:"),
        (["--temperature", "1", "--sampled-lossless-tokens", "1"], "--sampled-lossless-tokens 1:"),
    ],
)
def test_bad_check_settings_are_one_line(
    scripted_server: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    message: str,
) -> None:
    exact = f"{scripted_server}/markov/exact"
    assert bench(exact, tmp_path, *flags, "--check-sampled-lossless", exact) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) <= 2, err
