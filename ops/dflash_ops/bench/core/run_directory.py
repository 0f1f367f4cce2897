"""The output folder of a run, written while the run goes on so nothing measured is lost:

- `requests.jsonl`: one line per request as it completes (level, run, prompt id, the sampling
  seed it was sent if any, TTFT, the time of every streamed chunk, output tokens and how they
  were counted, a digest of the output text, the error if any);
- `results.json` and `results.md`: rewritten after every pass and level, atomically (a reader
  never sees half a file), with `status` running / complete / interrupted / failed;
- `acceptance.png`: drawn once, when the run ends (finished, interrupted or failed);
- `vllm/<level>/run=N.json` and `summary.json`: each pass in `vllm bench serve`'s format
  (`vllm_export`), written then too.

The folder is touched only once the run has something to write: a run that cannot reach its
server leaves the previous run's files in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import json
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from dflash_ops import directory_lock
from dflash_ops.bench.core import report, vllm_export
from dflash_ops.bench.core.atomic_files import replace_text
from dflash_ops.bench.core.client import RequestRecord
from dflash_ops.bench.core.prompts import Prompt
from dflash_ops.bench.core.results import BenchResult, BenchSettings, LevelResult
from dflash_ops.bench.core.runner import Level, LevelPlan, Target, now_iso, run_bench
from dflash_ops.errors import UserError


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def request_line(label: str, run: int, record: RequestRecord, origin: float) -> dict[str, Any]:
    """The per-request record; times in ms, `start_ms` from the beginning of the run."""
    return {
        "level": label,
        "run": run,
        "prompt_id": record.prompt_id,
        "seed": record.seed,
        "ok": record.ok,
        "start_ms": _ms(record.start - origin),
        "ttft_ms": _ms(record.ttft_s),
        "tpot_ms": _ms(record.tpot_s),
        "e2e_ms": _ms(record.latency_s),
        "output_tokens": record.output_tokens,
        "output_digest": record.output_digest,
        "prompt_tokens": record.prompt_tokens,
        "token_count_source": record.token_count_source,
        "chunk_times_ms": [round(t * 1000, 3) for t in record.chunk_times_s],
        "error": record.error,
        "error_kind": record.error_kind,
    }


class RunDirectory:
    def __init__(
        self, out: Path, save_result: bool = False, result_filename: str | None = None
    ) -> None:
        self.out = out
        # The vLLM-format export's single files (vllm_export.write), besides OUT/vllm/.
        self.save_result, self.result_filename = save_result, result_filename
        self.lines: list[dict[str, Any]] = []
        out.mkdir(parents=True, exist_ok=True)
        # One run writes a folder at a time: a second is refused, naming the first.
        self._lock = contextlib.ExitStack()
        self._lock.enter_context(
            directory_lock.holding(out, "write a benchmark there", directory_lock.RUN_LOCK)
        )
        self.requests_path = out / "requests.jsonl"
        self.results_path = out / "results.json"
        self.markdown_path = out / "results.md"
        self.plot_path = out / "acceptance.png"
        # Unbuffered: a record is on disk when record() returns, and a write that fails leaves
        # no half line behind in a buffer.
        self._requests: io.FileIO | None = None
        self._whole = 0  # bytes of requests.jsonl that are whole records
        self._last: BenchResult | None = None
        self._failed: str | None = None
        self._writer = {"pid": os.getpid(), "host": socket.gethostname()}
        self.origin = time.perf_counter()

    def _start(self) -> io.FileIO:
        if self._requests is None:
            # An earlier run's files must not pass for this run's, nor be lost: kept whole
            # under earlier/ (a run killed -9 included: it reads `died` there).
            self._keep_earlier()
            self._requests = io.FileIO(self.requests_path, "w")
        return self._requests

    def _keep_earlier(self) -> None:
        names = [*RUN_FILES, vllm_export.FOLDER]
        present = [self.out / name for name in names if (self.out / name).exists()]
        if not present:
            return
        started = "unknown-start"
        with contextlib.suppress(OSError, ValueError):
            started = json.loads(self.results_path.read_text())["started_at"]
        keep = self.out / EARLIER / re.sub(r"[^0-9A-Za-z.-]", "-", str(started))
        while keep.exists():
            keep = keep.with_name(keep.name + "-again")
        keep.mkdir(parents=True)
        for path in present:
            path.rename(keep / path.name)
        print(f"an earlier run in {self.out} is kept in {keep}", file=sys.stderr)

    def record(self, label: str, run: int, record: RequestRecord) -> None:
        if self._failed:
            return  # a write failed: the run is stopping, nothing more is written
        line = request_line(label, run, record, self.origin)
        self.lines.append(line)
        data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
        try:
            requests = self._start()
            while data:  # a full disk may take a part of it, then refuse the rest
                written = requests.write(data)
                if not written:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                data = data[written:]
        except OSError as err:
            self._cannot_write(err)
        self._whole = requests.tell()

    def save(self, result: BenchResult) -> None:
        """results.json and results.md as of now; the plot too once the run has ended."""
        if self._failed:
            return
        # Who writes it: a reader tells a run that died (kill -9) from one still running.
        result = result.model_copy(update=self._writer)
        self._last = result
        try:
            self._start()
            save_json(self.results_path, result.model_dump_json(indent=2))
            replace_text(self.markdown_path, report.markdown(result))
            if result.status != "running":  # the vLLM files and the plot, once, at the end
                vllm_export.write(
                    self.out, result, self.lines, self.save_result, self.result_filename
                )
                report.plot(result, self.plot_path)
        except OSError as err:
            self._cannot_write(err)

    def _cannot_write(self, err: OSError) -> NoReturn:
        """A write failed (a full disk): requests.jsonl is cut back to its last whole record,
        results.json says the run failed if it still can, and the run ends in one line."""
        why = f"--out {self.out}: cannot write there ({err.strerror or err})"
        self._failed = why
        if self._requests is not None:
            with contextlib.suppress(OSError):
                self._requests.truncate(self._whole)
                self._requests.close()
            self._requests = None
        if self._last is not None:
            failed = self._last.model_copy(
                update={"status": "failed", "stop_reason": why, "finished_at": now_iso()}
            )
            with contextlib.suppress(OSError):
                save_json(self.results_path, failed.model_dump_json(indent=2))
        raise UserError(
            f"{why}; the run stops, every request recorded before is whole in {self.requests_path}"
        )

    def paths(self) -> list[Path]:
        return RunDirectory.existing(self.out)

    @staticmethod
    def existing(out: Path) -> list[Path]:
        return [out / name for name in RUN_FILES if (out / name).exists()]

    def close(self) -> None:
        if self._requests is not None:
            with contextlib.suppress(OSError):
                self._requests.close()
        self._lock.close()


RUN_FILES = ("results.json", "results.md", "acceptance.png", "requests.jsonl")
EARLIER = "earlier"


def save_json(path: Path, text: str) -> None:
    replace_text(path, text)


class BenchInterrupted(Exception):
    """Ctrl-C or SIGTERM stopped the run; what it measured is written. `code`: 128 + signal."""

    def __init__(self, code: int, paths: list[Path]) -> None:
        super().__init__(code)
        self.code, self.paths = code, paths


def run_into(
    out: Path,
    target: Target,
    levels: list[Level] | LevelPlan,
    settings: BenchSettings,
    prompts: list[Prompt] | None = None,
    *,
    save_result: bool = False,
    result_filename: str | None = None,
    on_level: Callable[[LevelResult], None] | None = None,
) -> BenchResult:
    """Run the benchmark, writing `out` as it goes. Ctrl-C and SIGTERM stop it with what was
    measured written (BenchInterrupted); a run that stopped early raises runner.BenchStopped.
    `save_result`, `result_filename`: vllm bench serve's single-file results too."""
    directory = RunDirectory(out, save_result, result_filename)
    signals: list[int] = []

    async def main() -> BenchResult:
        task = asyncio.current_task()
        assert task is not None

        def stop(signum: int) -> None:
            signals.append(signum)
            task.cancel()

        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop, signal.SIGTERM)
        try:
            return await run_bench(
                target,
                levels,
                settings,
                prompts,
                on_result=directory.save,
                on_record=directory.record,
                on_level=on_level,
            )
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    try:
        return asyncio.run(main())
    except (KeyboardInterrupt, asyncio.CancelledError):
        code = 128 + (signals[0] if signals else signal.SIGINT)
        raise BenchInterrupted(code, directory.paths()) from None
    finally:
        directory.close()
