"""A pass's progress on stderr: one self-rewriting line on a terminal, quarters only in a log."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """One self-rewriting stderr line on a terminal; quarters only in a log."""

    def __init__(self, label: str, total: int | None, stream: TextIO | None = None) -> None:
        self.label, self.total, self.done, self.tokens = label, total, 0, 0
        # sys.stderr as it is now, not as it was when this module was imported (a default
        # argument would keep a stream someone has since replaced and closed).
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.started = time.perf_counter()

    def advance(self, tokens: int) -> None:
        self.done += 1
        self.tokens += tokens
        if self.total is None:
            if self.tty or self.done % 50 == 0:
                self._write(f"{self.done}")
            return
        if self.tty or self.done in {self.total * q // 4 for q in (1, 2, 3, 4)}:
            width = 20
            filled = width * self.done // max(self.total, 1)
            self._write(f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}")

    def _write(self, what: str) -> None:
        elapsed = time.perf_counter() - self.started
        end = "\r" if self.tty else "\n"
        self.stream.write(
            f"  {self.label} {what} requests, {self.tokens} tokens, {elapsed:.0f}s{end}"
        )
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
