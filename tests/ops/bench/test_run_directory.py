"""Nothing measured is lost: `dflash-serve bench` as a user runs it, against servers that die,
hang, restart their engine, lose their usage chunk, or a user who presses Ctrl-C.

Each case runs the real CLI in a subprocess and reads what it left in --out."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dflash_ops.loopback import start_server

from tests.conftest import REPO_ROOT


def command(base_url: str, out: Path, *flags: str) -> list[str]:
    return [
        sys.executable, "-m", "dflash_ops.cli", "bench", "--base-url", base_url, "--out", str(out),
        *flags,
    ]  # fmt: skip


def bench(base_url: str, out: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(base_url, out, *flags), capture_output=True, text=True, timeout=120, cwd=REPO_ROOT
    )


def load(concurrency: str, prompts: int, repeats: int, warmup: int, max_tokens: int) -> list[str]:
    return [
        "--concurrency", concurrency, "--num-requests", str(prompts), "--repeats", str(repeats),
        "--warmup", str(warmup), "--max-tokens", str(max_tokens),
    ]  # fmt: skip


def results(out: Path) -> dict[str, Any]:
    return json.loads((out / "results.json").read_text())  # type: ignore[no-any-return]


def request_lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]


@pytest.fixture()
def dying_server() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    process, url = start_server("tests.ops.bench.scripted_server", "--die-after", "10")
    yield process, url
    process.kill()
    process.wait(timeout=10)


def test_a_server_that_dies_mid_level_keeps_the_finished_level_and_the_partial_one(
    dying_server: tuple[subprocess.Popen[bytes], str], tmp_path: Path
) -> None:
    process, url = dying_server
    out = tmp_path / "out"
    done = bench(url, out, *load("1,2", prompts=6, repeats=1, warmup=0, max_tokens=4))
    assert process.wait(timeout=10) == 1  # it died at its 10th request
    assert done.returncode == 1, done.stderr
    assert "the run stopped early" in done.stderr and "stopped answering" in done.stderr
    saved = results(out)
    assert saved["status"] == "failed" and "stopped answering" in saved["stop_reason"]
    first, second = saved["levels"]
    assert first["partial"] is None and first["runs"][0]["requests"] == 6
    assert second["partial"].startswith("the server stopped answering")
    # Requests 7-9 went to level 2 two at a time; the 9th may be cut by the 10th's crash.
    assert second["runs"][0]["requests"] in (2, 3) and second["failures"]["connection"] >= 1
    lines = request_lines(out)
    assert [line["level"] for line in lines if line["ok"]].count("concurrency 1") == 6
    assert sum(line["ok"] for line in lines) == 6 + second["runs"][0]["requests"]
    assert "(partial)" in (out / "results.md").read_text()


def wait_for_lines(out: Path, count: int, process: subprocess.Popen[str], limit: float) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        path = out / "requests.jsonl"
        if path.is_file() and len(path.read_text().splitlines()) >= count:
            return
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} requests finished in {limit} s")


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_writes_what_was_measured(
    scripted_server: str, tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    out = tmp_path / "out"
    process = subprocess.Popen(
        command(f"{scripted_server}/slow", out, *load("1,2", 4, 1, 0, 6)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    try:
        wait_for_lines(out, 5, process, 60)  # level 1 (4 requests) and one of level 2
        process.send_signal(sig)
        _, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == code, stderr
    assert "interrupted: what was measured is in" in stderr
    saved = results(out)
    assert saved["status"] == "interrupted" and saved["finished_at"] is not None
    first, second = saved["levels"]
    assert first["partial"] is None and first["runs"][0]["requests"] == 4
    assert second["partial"] == "interrupted (Ctrl-C or SIGTERM)"
    assert 1 <= sum(r["requests"] for r in second["runs"]) <= 4
    assert second["ttft_ms"]["count"] == sum(r["requests"] for r in second["runs"])
    assert (out / "acceptance.png").is_file() and "Interrupted" in (out / "results.md").read_text()


def test_a_hung_server_is_a_counted_timeout_not_silence(
    scripted_server: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    started = time.monotonic()
    done = bench(f"{scripted_server}/hang", out, *load("2", 2, 1, 0, 4), "--request-timeout", "1")
    assert time.monotonic() - started < 30
    assert done.returncode == 1
    saved = results(out)
    level = saved["levels"][0]
    assert level["failures"] == {"timeout": 2}
    assert "no answer within --request-timeout 1 s" in level["errors"][0]
    assert (
        saved["status"] == "failed"
        and "every request at concurrency 2 failed" in saved["stop_reason"]
    )
    assert all(line["error_kind"] == "timeout" for line in request_lines(out))


def test_an_engine_restart_mid_level_is_named_and_never_mixed(
    scripted_server: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    done = bench(f"{scripted_server}/restarting", out, *load("1", 4, 3, 0, 4))
    assert done.returncode == 0, done.stderr
    level = results(out)["levels"][0]
    assert [run["engine_restarted"] for run in level["runs"]] == [False, True, False]
    # Runs 1 and 3 served 4 requests each (10 drafts, 15 accepted apiece); run 2 spans the
    # restart and is left out, so the level's figures are exactly those of runs 1 and 3.
    spec = level["spec_decode"]
    assert (spec["drafts"], spec["accepted"]) == (80, 120)
    assert spec["mean_acceptance_length"] == pytest.approx(2.5)
    assert level["runs"][1]["spec_decode"] is None
    assert any("restarted during run 2" in note for note in level["notes"])
    assert "restarted during run 2" in (out / "results.md").read_text()


def test_a_server_without_usage_needs_a_tokenizer_and_says_which_count_it_used(
    scripted_server: str, tmp_path: Path
) -> None:
    from dflash_ops.local.tiny_model import train_tokenizer

    out = tmp_path / "out"
    flags = load("1", prompts=2, repeats=1, warmup=1, max_tokens=5)
    refused = bench(f"{scripted_server}/no-usage", out, *flags)
    assert refused.returncode == 2
    assert "no usage chunk" in refused.stderr and "--tokenizer" in refused.stderr
    tokenizer = tmp_path / "tokenizer"
    train_tokenizer(tokenizer, 512)
    done = bench(f"{scripted_server}/no-usage", out, *flags, "--tokenizer", str(tokenizer))
    assert done.returncode == 0, done.stderr
    level = results(out)["levels"][0]
    assert level["token_count_source"] == "tokenizer"
    from transformers import AutoTokenizer

    expected = len(
        AutoTokenizer.from_pretrained(tokenizer).encode("tok " * 5, add_special_tokens=False)
    )
    assert [line["output_tokens"] for line in request_lines(out)] == [expected, expected]
    assert all(line["token_count_source"] == "tokenizer" for line in request_lines(out))
    assert "counted with the tokenizer" in (out / "results.md").read_text()


def test_started_at_is_the_start_and_a_failed_rerun_keeps_the_earlier_results(
    scripted_server: str, tmp_path: Path
) -> None:
    import datetime

    out = tmp_path / "out"
    done = bench(f"{scripted_server}/slow", out, *load("1", 3, 2, 0, 8))
    assert done.returncode == 0, done.stderr
    saved = results(out)
    started = datetime.datetime.fromisoformat(saved["started_at"])
    finished = datetime.datetime.fromisoformat(saved["finished_at"])
    assert (finished - started).total_seconds() >= 2  # 6 requests of 8 x 50 ms

    # A later run into the same folder that cannot reach its server loses nothing.
    def files() -> dict[str, bytes]:  # (the lock file names the run holding the folder)
        return {str(p): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name[0] != "."}

    kept = files()
    again = bench("http://127.0.0.1:9", out, "--concurrency", "1")
    assert again.returncode == 2 and "cannot reach" in again.stderr
    assert files() == kept


def slow_run(server: str, out: Path) -> subprocess.Popen[str]:
    """A bench of 40 requests against the 50 ms-a-token server: seconds of a running run."""
    return subprocess.Popen(
        command(f"{server}/slow", out, *load("1", 40, 1, 0, 4)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
    )  # fmt: skip


def test_a_run_killed_9_reads_died_and_a_rerun_into_its_out_loses_none_of_it(
    scripted_server: str, tmp_path: Path
) -> None:
    """kill -9 left results.json `running` forever, and a re-run into the same --out truncated
    the earlier requests.jsonl (8 lines to 4). Now the earlier run is kept whole under
    earlier/, and it reads `died`."""
    from dflash_ops.bench.core.result_file import read_result

    out = tmp_path / "out"
    first = slow_run(scripted_server, out)
    try:
        wait_for_lines(out, 3, first, 60)
        while not (out / "results.json").is_file():  # written after the first pass starts
            time.sleep(0.05)
    finally:
        first.kill()
        first.wait(timeout=10)
    before = (out / "requests.jsonl").read_text().splitlines()
    assert read_result(out / "results.json").status == "died"
    again = bench(f"{scripted_server}/slow", out, *load("1", 2, 1, 0, 4))
    assert again.returncode == 0, again.stderr
    (kept,) = (out / "earlier").iterdir()
    assert f"an earlier run in {out} is kept in {kept}" in again.stderr
    assert (kept / "requests.jsonl").read_text().splitlines()[: len(before)] == before
    assert all(json.loads(line) for line in (kept / "requests.jsonl").read_text().splitlines())
    assert read_result(kept / "results.json").status == "died"
    assert "**Died**" not in (out / "results.md").read_text()
    assert len((out / "requests.jsonl").read_text().splitlines()) == 2


def test_two_runs_cannot_share_one_out(scripted_server: str, tmp_path: Path) -> None:
    """Both exited 0 and the first's records were gone."""
    out = tmp_path / "out"
    first = slow_run(scripted_server, out)
    try:
        wait_for_lines(out, 1, first, 60)
        second = bench(f"{scripted_server}/slow", out, *load("1", 2, 1, 0, 4))
        assert second.returncode == 2
        assert "cannot write a benchmark there: `dflash-serve bench" in second.stderr
        assert f"(pid {first.pid}) is working on {out}" in second.stderr
    finally:
        first.kill()
        first.wait(timeout=10)


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 96 KiB tmpfs: a disk that fills in the middle of a run."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(mount)],
        capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"a full disk needs a small tmpfs, and mount was refused here: {done.stderr}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_fails_the_run_in_one_line_and_keeps_every_record_whole(
    instant_server: str, small_disk: Path
) -> None:
    """It gave chained tracebacks and a cut-off last record."""
    out = small_disk / "out"
    done = bench(instant_server, out, *load("1,2", 2000, 1, 0, 16))
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "cannot write there (No space left on device)" in last, last
    lines = (out / "requests.jsonl").read_text().splitlines()
    assert lines and all(json.loads(line)["ok"] for line in lines)  # every one whole
    assert (out / "requests.jsonl").read_bytes().endswith(b"\n")
    if (out / "results.json").is_file():  # the last one written whole, read as ended
        from dflash_ops.bench.core.result_file import read_result

        assert read_result(out / "results.json").status in ("failed", "died")
