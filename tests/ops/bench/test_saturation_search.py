"""The saturation search: its choice of loads over synthetic outcomes (any capacity, both axes,
bounded), the SLO parser under garbage, and a real search against a server whose latency grows
with load."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
from dflash_ops.bench.core import slo
from dflash_ops.bench.core.client import RequestRecord
from dflash_ops.bench.core.results import LevelResult, Spread
from dflash_ops.bench.saturation_search import SaturationSearch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import REPO_ROOT


def level(attainment: float, partial: str | None = None) -> LevelResult:
    spread = Spread.of([1.0])
    return LevelResult(
        concurrency=1, request_rate=None, runs=[], output_tokens_per_s=spread,
        requests_per_s=spread, ttft_ms=None, tpot_ms=None, itl_ms=None, e2e_ms=None,
        spec_decode=None, slo_attainment=attainment, partial=partial,
    )  # fmt: skip


def drive(search: SaturationSearch, capacity: float) -> list[float]:
    """Run the search against a server that meets the SLO up to `capacity`."""
    done: list[LevelResult] = []
    while (next_level := search.next_level(done)) is not None:
        load = next_level.concurrency or next_level.request_rate
        assert load is not None
        done.append(level(1.0 if load <= capacity else 0.5))
    assert search.summary(done).probes[-1].load == search.loads[-1]
    return search.loads


@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(0, 600), low=st.integers(1, 8), high=st.integers(8, 512))
def test_concurrency_search_finds_the_capacity_within_its_probe_budget(
    capacity: int, low: int, high: int
) -> None:
    search = SaturationSearch("concurrency", low, high, attainment=0.9, max_probes=20)
    loads = drive(search, capacity)
    best = search.summary([level(1.0 if x <= capacity else 0.5) for x in loads]).best
    assert len(loads) <= 20 and len(set(loads)) == len(loads)  # never the same load twice
    assert all(low <= x <= high and x == int(x) for x in loads)
    if capacity < low:
        assert best is None and loads == [low]
    else:
        assert best == min(capacity, high)


@settings(max_examples=200, deadline=None)
@given(capacity=st.floats(0.5, 300.0), high=st.floats(1.0, 500.0))
def test_rate_search_ends_within_ten_percent(capacity: float, high: float) -> None:
    search = SaturationSearch("request-rate", 0.5, high, attainment=0.9, max_probes=30)
    loads = drive(search, capacity)
    best = search.summary([level(1.0 if x <= capacity else 0.5) for x in loads]).best
    assert best is not None and best <= min(capacity, high)
    if capacity < high:
        failing = min(x for x in loads if x > capacity)
        assert failing - best <= 0.1 * best + 1e-9
    else:
        assert best == high


def test_a_partial_level_never_passes() -> None:
    search = SaturationSearch("concurrency", 1, 8, attainment=0.5)
    assert search.next_level([]) is not None
    assert search.next_level([level(1.0, partial="the server stopped answering")]) is None
    assert search.summary([level(1.0, partial="x")]).best is None


def test_the_probe_budget_bounds_the_search() -> None:
    search = SaturationSearch("concurrency", 1, 1_000_000, attainment=0.9, max_probes=5)
    assert len(drive(search, 10**9)) == 5


@given(st.text(max_size=40))
def test_slo_parser_refuses_garbage_with_argparse_errors(text: str) -> None:
    try:
        objectives = slo.parse(text)
    except argparse.ArgumentTypeError:
        return
    assert objectives and set(objectives) <= set(slo.OBJECTIVES)
    assert all(0 < ms < float("inf") for ms in objectives.values())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ttft:500,tpot:50", {"ttft": 500.0, "tpot": 50.0}),
        ("ttft:500 e2e:1e4", {"ttft": 500.0, "e2e": 10000.0}),
    ],
)
def test_slo_parser_takes_vllm_spelling(text: str, expected: dict[str, float]) -> None:
    assert slo.parse(text) == expected


@pytest.mark.parametrize(
    "text", ["ttft", "ttft:abc", "itl:5", "ttft:-1", "ttft:nan", "ttft:1,ttft:2", ""]
)
def test_slo_parser_refusals(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        slo.parse(text)


def test_is_good_needs_success_and_every_objective() -> None:
    record = RequestRecord(ok=True, start=0.0, ttft_s=0.1, end=1.1, output_tokens=11)
    assert slo.is_good(record, {"ttft": 150, "tpot": 100.5, "e2e": 1200})
    assert not slo.is_good(record, {"tpot": 99})
    assert not slo.is_good(RequestRecord(ok=False, error="x"), {"e2e": 10**6})
    one_token = RequestRecord(ok=True, start=0.0, ttft_s=0.1, end=0.1, output_tokens=1)
    assert slo.is_good(one_token, {"tpot": 1})  # no TPOT to miss


def test_search_against_a_server_whose_latency_grows_with_load(
    scripted_server: str, tmp_path: Path
) -> None:
    # /queue: each request takes 200 ms per request in flight, so e2e ~ 200 ms x concurrency;
    # e2e <= 1700 ms holds up to 8 in flight, with 100 ms on either side for the client's own
    # delays on a loaded machine (at 50 ms a request and 425 ms, a run beside a CI run found 5).
    out = tmp_path / "search"
    done = subprocess.run(
        [sys.executable, "-m", "dflash_ops.cli", "bench", "search", "--base-url",
         f"{scripted_server}/queue", "--out", str(out), "--goodput", "e2e:1700", "--low", "1",
         "--high", "64", "--num-requests", "16", "--warmup", "0", "--max-tokens", "2"],
        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "search.json").read_text())
    assert summary["best"] == 8, (out / "results.md").read_text() and not summary["bounded_by_high"]
    assert [p["load"] for p in summary["probes"]][:5] == [1, 2, 4, 8, 16]
    assert "highest load meeting 90% of requests within e2e <= 1700 ms: 8 in flight" in done.stdout
    results = json.loads((out / "results.json").read_text())
    assert [lv["concurrency"] for lv in results["levels"]] == [p["load"] for p in summary["probes"]]
