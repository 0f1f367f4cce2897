"""Every server is hostile: whatever a stream carries fails that request by kind, never the run,
and no count it reports is believed beyond what was streamed and asked for (issue 76). Each case
is the bench over the scripted server's /hostile/K/ behaviour."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from dflash_ops.bench.core.client import impossible_usage, usage_count

CASES = {
    "choices-object": "a malformed stream: KeyError",
    "usage-infinity": "usage.completion_tokens inf is not a count",
    "usage-negative": "usage.completion_tokens -5 is not a count",
    "usage-billion": "impossible usage: 1000000000 completion tokens for max_tokens 20",
    "usage-over-max": "impossible usage: 5000 completion tokens for max_tokens 20",
}


@pytest.mark.parametrize("kind", list(CASES))
def test_a_hostile_stream_fails_its_requests_by_kind_and_the_run_goes_on(
    scripted_server: str, tmp_path: Path, kind: str
) -> None:
    max_tokens = "20"
    done = subprocess.run(
        [sys.executable, "-m", "dflash_ops.cli", "bench",
         "--base-url", f"{scripted_server}/hostile/{kind}", "--concurrency", "1,2",
         "--num-requests", "3", "--repeats", "1", "--warmup", "0", "--temperature", "0",
         "--max-tokens", max_tokens, "--result-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    # Every request of the level failed: the run stops there, in one line naming why, with what
    # it measured written (rc 1, status failed), as it does for any server that serves nothing.
    assert done.returncode == 1 and CASES[kind] in done.stderr.strip().splitlines()[-1]
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["status"] == "failed" and CASES[kind] in result["stop_reason"]
    (level,) = result["levels"]
    assert level["failures"] == {"protocol": 3}, level["failures"]
    assert CASES[kind] in level["errors"][0]
    # No figure a stream cannot give: nothing counted from a request that failed.
    assert all(run["output_tokens"] == 0 for run in level["runs"])
    assert level["output_tokens_per_s"]["mean"] == 0


def test_usage_is_a_count_or_refused() -> None:
    assert usage_count({"completion_tokens": 12}, "completion_tokens") == 12
    assert usage_count({"completion_tokens": None}, "completion_tokens") == 0
    assert usage_count({}, "prompt_tokens") == 0
    for bad in (float("inf"), float("nan"), -1, 2.5, "12", True, [3]):
        with pytest.raises(ValueError, match="is not a count"):
            usage_count({"completion_tokens": bad}, "completion_tokens")
    assert impossible_usage(20, 20) is None and impossible_usage(64, 100) is None
    assert impossible_usage(21, 20) is not None


def test_tokens_whose_text_was_held_back_are_believed(scripted_server: str, tmp_path: Path) -> None:
    """vLLM streams no chunk for a token whose text it holds back (an unfinished UTF-8
    character, a skipped special token), so usage can count many more tokens than chunks: 321
    tokens in 20 chunks is a real stream (a tiny engine behind the router sent 32 in one), not a
    lie, and no bound on tokens per chunk may refuse it."""
    done = subprocess.run(
        [sys.executable, "-m", "dflash_ops.cli", "bench",
         "--base-url", f"{scripted_server}/hostile/text-held-back", "--concurrency", "1",
         "--num-requests", "2", "--repeats", "1", "--warmup", "0", "--temperature", "0",
         "--max-tokens", "1000", "--result-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (level,) = json.loads((tmp_path / "results.json").read_text())["levels"]
    assert level["failures"] == {}, level["failures"]
    assert sum(run["output_tokens"] for run in level["runs"]) == 2 * 321
