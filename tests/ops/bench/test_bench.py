"""The benchmark against real sockets: the instant server and scripted misbehaving ones."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from dflash_ops.bench.core import report
from dflash_ops.bench.core.client import Endpoint, check_base_url
from dflash_ops.bench.core.lossless import check_lossless
from dflash_ops.bench.core.prompts import RandomShape, build
from dflash_ops.bench.core.results import BenchResult, BenchSettings, Percentiles, Spread
from dflash_ops.bench.core.run_directory import RunDirectory
from dflash_ops.bench.core.runner import Level, Target, run_bench
from dflash_ops.errors import UserError
from dflash_ops.loopback import free_port


def settings(**overrides: object) -> BenchSettings:
    values: dict[str, object] = {
        "prompt_set": "fixed",
        "input_len": 32,
        "max_tokens": 16,
        "num_requests": 12,
        "duration_s": None,
        "repeats": 2,
        "warmup": 1,
        "seed": 0,
    }
    values.update(overrides)
    return BenchSettings.model_validate(values)


def test_a_level_reports_latencies_throughput_spread_and_acceptance(instant_server: str) -> None:
    result = asyncio.run(
        run_bench(Target(instant_server), [Level(concurrency=1), Level(concurrency=4)], settings())
    )
    assert result.model == "fake"
    assert [level.label for level in result.levels] == ["concurrency 1", "concurrency 4"]
    for level in result.levels:
        assert [r.requests for r in level.runs] == [12, 12]
        assert all(r.output_tokens == 12 * 16 and r.failed == 0 for r in level.runs)
        assert level.output_tokens_per_s.runs == 2
        assert level.output_tokens_per_s.min <= level.output_tokens_per_s.mean
        assert level.ttft_ms is not None and level.ttft_ms.count == 24
        assert level.e2e_ms is not None and level.e2e_ms.p50 >= level.ttft_ms.p50
        spec = level.spec_decode
        assert spec is not None and spec.mean_acceptance_length is not None
        assert 1 <= spec.mean_acceptance_length <= 4  # the fake server's k = 3
    # results.json round-trips and the report says what it measured
    again = BenchResult.model_validate_json(result.model_dump_json())
    assert again == result
    text = report.markdown(result)
    assert "| concurrency 4 | 24/0 |" in text and "TTFT p50 / p99" in text


def test_request_rate_mode_spaces_arrivals_like_a_poisson_process(instant_server: str) -> None:
    started = time.perf_counter()
    result = asyncio.run(
        run_bench(
            Target(instant_server, "fake"),
            [Level(request_rate=20.0, max_concurrency=4)],
            settings(num_requests=40, repeats=1, warmup=0),
        )
    )
    elapsed = time.perf_counter() - started
    level = result.levels[0]
    assert level.label == "rate 20/s, max 4 in flight"
    assert level.runs[0].requests == 40
    # 40 arrivals at 20/s take about 2 s (an instant server answers at once)
    assert 1.0 < level.runs[0].wall_s < 5.0 and elapsed < 30


def test_duration_mode_stops_issuing_at_the_deadline(instant_server: str) -> None:
    result = asyncio.run(
        run_bench(
            Target(instant_server, "fake"),
            [Level(concurrency=2)],
            settings(num_requests=None, duration_s=1.0, repeats=1, warmup=0),
        )
    )
    run = result.levels[0].runs[0]
    assert run.requests > 2 and run.wall_s < 3.0


def test_streamed_latencies_are_measured_per_chunk(scripted_server: str) -> None:
    async def one() -> tuple[float | None, list[float], int]:
        endpoint = Endpoint(f"{scripted_server}/slow")
        try:
            record = await endpoint.stream_chat("fake", [{"role": "user", "content": "x"}], 6)
        finally:
            await endpoint.aclose()
        return record.ttft_s, record.chunk_gaps_s, record.output_tokens

    ttft, gaps, tokens = asyncio.run(one())
    assert tokens == 6 and len(gaps) == 5
    assert ttft is not None and ttft >= 0.04
    assert all(0.03 < gap < 0.5 for gap in gaps)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://127.0.0.1:8000", "expected http:// or https://"),
        ("http://127.0.0.1:99999", "the port is not a number in 1-65535"),
        ("http://:8000", "expected a host"),
        ("127.0.0.1:8000", "expected http:// or https://"),
    ],
)
def test_bad_base_urls_are_named(url: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        check_base_url(url)


def test_unreachable_server_fails_fast_naming_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(UserError, match=f"cannot reach {url}/v1/models"):
        asyncio.run(run_bench(Target(url), [Level(concurrency=1)], settings()))
    assert time.monotonic() - started < 12  # the 10 s connect timeout at most


def test_non_json_model_list_and_failing_requests_are_one_line_errors(
    scripted_server: str,
) -> None:
    with pytest.raises(UserError, match="is not an OpenAI model list: '<html>502"):
        asyncio.run(
            run_bench(Target(f"{scripted_server}/garbage"), [Level(concurrency=1)], settings())
        )
    with pytest.raises(UserError, match=r"model 'qwen' is not served at .*; it serves: fake"):
        asyncio.run(
            run_bench(
                Target(f"{scripted_server}/no-ids", "qwen"), [Level(concurrency=1)], settings()
            )
        )


def test_lossless_check_is_never_vacuous(instant_server: str, scripted_server: str) -> None:
    async def check(ours: str, reference: str) -> object:
        a, b = Endpoint(ours), Endpoint(reference)
        try:
            return await check_lossless(a, b, "fake", "fake", 8, [1, 4])
        finally:
            await a.aclose()
            await b.aclose()

    # Both sides answer without token ids: refused, not "10/10 identical".
    with pytest.raises(UserError, match="needs token ids"):
        asyncio.run(check(f"{scripted_server}/no-ids", f"{scripted_server}/no-ids"))
    # A reference that speculates proves nothing.
    with pytest.raises(UserError, match="serves with speculative decoding"):
        asyncio.run(check(instant_server, f"{scripted_server}/speculating"))
    # Different tokens are found, at both concurrencies.
    result = asyncio.run(check(instant_server, f"{scripted_server}/good"))
    assert result.prompts == 20 and result.identical == 20 and result.passed  # type: ignore[attr-defined]
    mismatch = asyncio.run(check(instant_server, f"{scripted_server}/other"))
    assert not mismatch.passed and len(mismatch.mismatches) == 20  # type: ignore[attr-defined]
    assert "at concurrency 4: first differing token at 0" in mismatch.mismatches[-1]  # type: ignore[attr-defined]


def test_compare_puts_runs_side_by_side_with_ratios_to_the_first(instant_server: str) -> None:
    a = asyncio.run(
        run_bench(
            Target(instant_server, "fake"), [Level(concurrency=1), Level(concurrency=2)], settings()
        )
    )
    slower = a.model_copy(deep=True)
    for level in slower.levels:
        level.output_tokens_per_s.mean /= 2
    only_one = a.model_copy(update={"levels": a.levels[1:]})
    table = report.compare([("mtp3", a), ("dflash2", slower), ("off", only_one)])
    header, _, *rows = [line for line in table.splitlines() if line.startswith("|")]
    assert "Workload of every run: temperature 0 (greedy), ignore-eos." in table
    assert header == "| metric | level | mtp3 | dflash2 | off | dflash2 / mtp3 | off / mtp3 |"
    # Only the level all three share, every metric a row, each run's ratio to the first.
    assert {row.split(" | ")[1] for row in rows} == {"concurrency 2"}
    throughput = next(row for row in rows if row.startswith("| output tok/s"))
    assert throughput.endswith("| 0.50x | 1.00x |")
    assert any(row.startswith("| TPOT p99 ms") for row in rows)
    with pytest.raises(ValueError, match="share no load level"):
        report.compare([("a", a), ("b", a.model_copy(update={"levels": []}))])


def test_spread_and_percentiles() -> None:
    spread = Spread.of([10.0, 12.0, 14.0])
    assert (spread.mean, spread.min, spread.max, spread.runs) == (12.0, 10.0, 14.0, 3)
    assert spread.stdev == pytest.approx(2.0)
    p = Percentiles.of_seconds([i / 1000 for i in range(1, 101)])
    assert p is not None and p.count == 100
    assert (p.p50, p.p90, p.p99) == pytest.approx((50.5, 90.1, 99.01))
    # p99 of 20 samples lies between the two largest, not on the largest (nearest rank).
    few = Percentiles.of_seconds([i / 1000 for i in range(1, 21)])
    assert few is not None and few.p99 == pytest.approx(19.81) and few.count == 20
    one = Percentiles.of_seconds([0.005])
    assert one is not None and one.p50 == one.p99 == 5
    assert Percentiles.of_seconds([]) is None


def test_prompt_sets(tokenizer: Any) -> None:
    fixed = build("fixed", 12)
    assert len(fixed) == 12 and fixed[10].messages == fixed[0].messages

    def tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    shape = RandomShape(input_len=40, output_len=10, input_ratio=0.5, output_ratio=0.2)
    random_set = build("random", 8, shape, seed=1, tokenizer=tokenizer)
    lengths = [tokens(p.messages[0]["content"]) for p in random_set]
    # vLLM's interval [floor(40 x 0.5), ceil(40 x 1.5)], give or take a token where the decoded
    # text re-tokenizes at a joint differently
    assert all(19 <= n <= 61 for n in lengths) and len(set(lengths)) > 1, lengths
    assert {p.max_tokens for p in random_set} <= set(range(8, 13))
    assert build("random", 8, shape, seed=1, tokenizer=tokenizer) == random_set
    fixed_len = build("random", 4, RandomShape(input_len=24, prefix_len=6), tokenizer=tokenizer)
    assert all(abs(tokens(p.messages[0]["content"]) - 30) <= 1 for p in fixed_len)
    assert all(p.max_tokens is None for p in fixed_len)  # no --random-output-len: --max-tokens
    heads = {tokenizer.decode(tokenizer.encode(p.messages[0]["content"])[:4]) for p in fixed_len}
    assert len(heads) == 1  # one prefix for all
    with pytest.raises(ValueError, match="sized in tokens"):
        build("random", 2)
    shared = build("shared-prefix", 4, RandomShape(input_len=100), tokenizer=tokenizer)
    systems = {p.messages[0]["content"] for p in shared}
    assert len(systems) == 1 and tokens(next(iter(systems))) >= 100
    assert len({p.messages[1]["content"] for p in shared}) == 4
    groups = build(
        "shared-prefix", 7, RandomShape(input_len=50), prefix_groups=3, tokenizer=tokenizer
    )
    by_group = [p.messages[0]["content"] for p in groups]
    assert len(set(by_group)) == 3 and by_group[:3] == by_group[3:6] == [
        by_group[6],
        *by_group[1:3],
    ]
    assert [p.id.split("-")[1] for p in groups] == ["0", "1", "2", "0", "1", "2", "0"]


def test_the_run_directory_holds_every_request_and_the_last_result(
    instant_server: str, tmp_path: Path
) -> None:
    directory = RunDirectory(tmp_path)
    seen: list[str] = []

    def save(result: BenchResult) -> None:
        seen.append(result.status)
        directory.save(result)

    result = asyncio.run(
        run_bench(
            Target(instant_server, "fake"), [Level(concurrency=2)], settings(), on_result=save,
            on_record=directory.record,
        )
    )  # fmt: skip
    directory.close()
    # Written while it ran (after each pass and level), then once complete.
    assert seen[0] == "running" and seen[-1] == "complete" and len(seen) >= 4
    assert [p.name for p in directory.paths()] == [
        "results.json", "results.md", "acceptance.png", "requests.jsonl"
    ]  # fmt: skip
    saved = BenchResult.model_validate_json(directory.results_path.read_text())
    assert saved.model_copy(update={"pid": None, "host": None}) == result
    assert saved.pid == os.getpid() and saved.host  # who wrote it, to tell a run that died
    assert directory.plot_path.read_bytes()[:4] == b"\x89PNG"
    lines = [json.loads(x) for x in directory.requests_path.read_text().splitlines()]
    assert len(lines) == 24 and {line["run"] for line in lines} == {1, 2}
    assert all(line["ok"] and line["output_tokens"] == 16 for line in lines)
    assert all(len(line["chunk_times_ms"]) == 16 for line in lines)
    assert all(line["ttft_ms"] == line["chunk_times_ms"][0] for line in lines)


def test_goodput_counts_requests_meeting_every_objective(scripted_server: str) -> None:
    # /slow streams a token every 50 ms: TTFT ~50 ms, TPOT ~50 ms.
    lenient = asyncio.run(
        run_bench(
            Target(f"{scripted_server}/slow", "fake"), [Level(concurrency=2)],
            settings(num_requests=4, repeats=1, warmup=0, max_tokens=4,
                     goodput={"ttft": 5000.0, "tpot": 5000.0}),
        )
    )  # fmt: skip
    level = lenient.levels[0]
    assert level.slo_attainment == 1.0 and level.runs[0].good_requests == 4
    assert level.goodput_requests_per_s is not None
    assert level.goodput_requests_per_s.mean == pytest.approx(level.requests_per_s.mean)
    strict = asyncio.run(
        run_bench(
            Target(f"{scripted_server}/slow", "fake"), [Level(concurrency=2)],
            settings(num_requests=4, repeats=1, warmup=0, max_tokens=4,
                     goodput={"ttft": 5000.0, "tpot": 10.0}),
        )
    )  # fmt: skip
    assert strict.levels[0].slo_attainment == 0.0
    assert strict.levels[0].goodput_requests_per_s.mean == 0.0  # type: ignore[union-attr]
    assert "tpot <= 10 ms" in report.markdown(strict)


def test_compare_cli_needs_a_common_level_and_two_runs(instant_server: str, tmp_path: Path) -> None:
    import subprocess
    import sys

    a = asyncio.run(
        run_bench(Target(instant_server, "fake"), [Level(concurrency=1)], settings(repeats=1))
    )
    b = asyncio.run(
        run_bench(Target(instant_server, "fake"), [Level(concurrency=2)], settings(repeats=1))
    )
    for name, result in (("a", a), ("b", b)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(result.model_dump_json())

    def compare(*runs: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dflash_ops.cli", "bench", "compare", *runs],
            capture_output=True,
            text=True,
            timeout=60,
        )

    disjoint = compare(str(tmp_path / "a"), str(tmp_path / "b"))
    assert disjoint.returncode == 2
    assert "share no load level (a: concurrency 1; b: concurrency 2)" in disjoint.stderr
    alone = compare(str(tmp_path / "a"))
    assert alone.returncode == 2 and "at least two runs" in alone.stderr
    same = compare(str(tmp_path / "a"), str(tmp_path / "a" / "results.json"))
    assert same.returncode == 0 and "| output tok/s (mean) | concurrency 1 |" in same.stdout


def test_identical_greedy_curves_are_drawn_once(instant_server: str) -> None:
    result = asyncio.run(
        run_bench(
            Target(instant_server, "fake"), [Level(concurrency=1), Level(concurrency=2)], settings()
        )
    )
    # The instant server's acceptance is the same at every load, as greedy decoding's is.
    groups = report.curve_groups(result)
    assert [label for label, _ in groups] == ["concurrency 1 = concurrency 2"]
    other = result.model_copy(deep=True)
    assert other.levels[1].spec_decode is not None
    other.levels[1].spec_decode.per_position_acceptance = [0.5, 0.3, 0.1]
    assert [label for label, _ in report.curve_groups(other)] == ["concurrency 1", "concurrency 2"]


def test_each_level_samples_the_engines_running_batch(scripted_server: str) -> None:
    """/batch holds each request 1.5 s and reports the requests in flight as
    vllm:num_requests_running: the level's running batch is the concurrency it keeps. (Held
    400 ms, a loaded machine's delay in sending the next request showed as fewer running.)"""
    result = asyncio.run(
        run_bench(
            Target(f"{scripted_server}/batch", "fake"),
            [Level(concurrency=1), Level(concurrency=4)],
            settings(num_requests=None, duration_s=2.5, repeats=1, warmup=0),
        )
    )
    alone, four = (level.running_batch for level in result.levels)
    assert alone is not None and four is not None
    assert alone.max == 1 and alone.samples >= 2
    assert four.max == 4 and four.p50 >= 3 and four.samples >= 2
    # Written with the results (what the sweep reads back).
    again = BenchResult.model_validate_json(result.model_dump_json())
    assert again.levels[1].running_batch == four


def test_no_running_batch_without_the_gauge() -> None:
    from dflash_ops.bench.core.runner import running_requests_of

    assert running_requests_of({"a": None, "b": "vllm:generation_tokens_total 3\n"}) is None
    two = 'vllm:num_requests_running{engine="0",model_name="m"} 2\n'
    three = 'vllm:num_requests_running{engine="0",model_name="m"} 3\n'
    assert running_requests_of({"a": two, "b": three}) == 5  # replicas behind a router


def test_progress_of_a_timed_run_counts_requests_in_words_once() -> None:
    import io

    from dflash_ops.bench.core.runner import Progress

    stream = io.StringIO()
    progress = Progress("concurrency 4, run 1/3:", None, stream)
    for _ in range(50):
        progress.advance(2)
    assert stream.getvalue().startswith("  concurrency 4, run 1/3: 50 requests, 100 tokens, ")
