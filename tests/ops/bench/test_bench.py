"""The benchmark against real sockets: the instant server and scripted misbehaving ones."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from dflash_ops.bench import report
from dflash_ops.bench.client import Endpoint, check_base_url
from dflash_ops.bench.prompts import build
from dflash_ops.bench.results import BenchResult, BenchSettings, Percentiles, Spread
from dflash_ops.bench.runner import Level, check_lossless, run_bench
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
        run_bench(instant_server, None, [Level(concurrency=1), Level(concurrency=4)], settings())
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
            instant_server,
            "fake",
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
            instant_server,
            "fake",
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
        asyncio.run(run_bench(url, None, [Level(concurrency=1)], settings()))
    assert time.monotonic() - started < 12  # the 10 s connect timeout at most


def test_non_json_model_list_and_failing_requests_are_one_line_errors(
    scripted_server: str,
) -> None:
    with pytest.raises(UserError, match="is not an OpenAI model list: '<html>502"):
        asyncio.run(
            run_bench(f"{scripted_server}/garbage", None, [Level(concurrency=1)], settings())
        )
    with pytest.raises(UserError, match=r"model 'qwen' is not served at .*; it serves: fake"):
        asyncio.run(
            run_bench(f"{scripted_server}/no-ids", "qwen", [Level(concurrency=1)], settings())
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


def test_compare_puts_two_runs_side_by_side(instant_server: str) -> None:
    a = asyncio.run(run_bench(instant_server, "fake", [Level(concurrency=1)], settings(repeats=1)))
    table = report.compare(a, a, "mtp3", "dflash2")
    assert "| output tok/s (mean) | concurrency 1 |" in table and "1.00x" in table
    b = a.model_copy(update={"levels": []})
    assert report.compare(a, b, "a", "b") == "the two runs share no load level\n"


def test_spread_and_percentiles() -> None:
    spread = Spread.of([10.0, 12.0, 14.0])
    assert (spread.mean, spread.min, spread.max, spread.runs) == (12.0, 10.0, 14.0, 3)
    assert spread.stdev == pytest.approx(2.0)
    p = Percentiles.of_seconds([i / 1000 for i in range(1, 101)])
    assert p is not None and (p.p50, p.p90, p.p99, p.count) == (50, 90, 99, 100)
    assert Percentiles.of_seconds([]) is None


def test_prompt_sets() -> None:
    fixed = build("fixed", 12)
    assert len(fixed) == 12 and fixed[10].messages == fixed[0].messages
    random_set = build("random", 5, input_len=40, seed=1)
    lengths = [len(p.messages[0]["content"].split()) for p in random_set]
    assert all(20 <= n <= 60 for n in lengths) and len(set(lengths)) > 1
    assert build("random", 5, input_len=40, seed=1) == random_set
    shared = build("shared-prefix", 4, input_len=100)
    systems = {p.messages[0]["content"] for p in shared}
    assert len(systems) == 1 and len(next(iter(systems)).split()) > 100
    assert len({p.messages[1]["content"] for p in shared}) == 4


def test_results_json_is_what_the_report_writes(instant_server: str, tmp_path: Path) -> None:
    result = asyncio.run(run_bench(instant_server, "fake", [Level(concurrency=2)], settings()))
    paths = report.write(result, tmp_path)
    assert [p.name for p in paths] == ["results.json", "results.md", "acceptance.png"]
    assert json.loads(paths[0].read_text())["levels"][0]["concurrency"] == 2
    assert paths[2].read_bytes()[:4] == b"\x89PNG"
