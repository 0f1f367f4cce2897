"""`dflash-serve bench lossless-power` against samplers whose truth is known (the scripted
server's /markov/ chain: `exact` samples it, `sharp` is a broken speculative sampler)."""

from __future__ import annotations

import json

import pytest
from dflash_ops.bench.lossless_power import wilson
from dflash_ops.cli import main

SMALL = [
    "--samples", "100", "--prompts", "3", "--tokens", "4", "--trials", "12",
    "--permutations", "99", "--alpha", "0.05", "--concurrency", "8",
]  # fmt: skip


def power(capsys: pytest.CaptureFixture[str], base: str, reference: str, *flags: str) -> dict:
    assert main(["bench", "lossless-power", "--base-url", base, "--reference-url", reference,
                 *SMALL, *flags]) == 0  # fmt: skip
    out = capsys.readouterr().out
    result = json.loads(out[: out.rindex("}") + 1])
    assert "false alarms" in out and "detected" in out
    return {rate["counts_as"]: rate for rate in result["rates"]}


def test_rates_tell_a_lossless_sampler_from_a_broken_one(
    scripted_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    exact = f"{scripted_server}/markov/exact"
    same = power(capsys, exact, exact, "--planted-temperature", "0.5")
    assert same["false alarms"]["failures"] <= 3  # at alpha 0.05 over 12 trials
    assert same["speculation judged not lossless"]["failures"] <= 3
    assert same["detected"]["failures"] >= 10  # temperature 0.5 against 1 is no subtle plant
    broken = power(capsys, f"{scripted_server}/markov/sharp", exact)
    assert broken["speculation judged not lossless"]["failures"] >= 10


def test_wilson_interval_holds_the_rate_and_stays_in_bounds() -> None:
    assert wilson(0, 100) == (0.0, pytest.approx(0.037, abs=0.001))
    low, high = wilson(95, 100)
    assert low < 0.95 < high and high <= 1.0


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [("--samples", "5", "--samples 5:"), ("--alpha", "1", "--alpha 1.0:"),
     ("--planted-temperature", "0", "--planted-temperature 0.0:")],
)  # fmt: skip
def test_a_bad_setting_is_one_line(
    scripted_server: str, capsys: pytest.CaptureFixture[str], flag: str, value: str, message: str
) -> None:
    exact = f"{scripted_server}/markov/exact"
    code = main(["bench", "lossless-power", "--base-url", exact, "--reference-url", exact,
                 flag, value])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err


def test_kept_pools_give_the_same_trials_without_the_engines(
    scripted_server: str, capsys: pytest.CaptureFixture[str], tmp_path
) -> None:
    exact = f"{scripted_server}/markov/exact"
    pools = tmp_path / "pools.json"
    first = power(capsys, exact, exact, "--pools", str(pools))
    assert pools.is_file()
    again = power(capsys, "http://127.0.0.1:9", "http://127.0.0.1:9", "--pools", str(pools))
    assert again == first  # nothing listens on port 9: the pools alone
    assert main(["bench", "lossless-power", "--base-url", exact, "--reference-url", exact,
                 "--pools", str(pools), "--samples", "200"]) == 2  # fmt: skip
    assert "a trial of --samples 200 draws 400" in capsys.readouterr().err
