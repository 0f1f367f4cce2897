"""Log a repeated fault once, then at most once a minute with the count of repeats; values
from the engine are cut to MAX_VALUE characters (a 5 MB label must not reach the log)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

MAX_VALUE = 300


def cut(value: object) -> object:
    """`value` for a log line: numbers as they are, anything else at most MAX_VALUE chars."""
    if isinstance(value, int | float):
        return value
    text = value if isinstance(value, str) else str(value)
    if len(text) <= MAX_VALUE:
        return value
    return f"{text[:MAX_VALUE]}... ({len(text)} characters)"


class LogLimiter:
    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 64,
    ) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self.clock = clock
        self.max_keys = max_keys
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def log(
        self, level: int, key: str, message: str, *args: object, exc_info: bool = False
    ) -> bool:
        """Log `message` unless `key` was logged less than `interval_s` ago; True if logged."""
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        if last is None and len(self._last) >= self.max_keys:
            self._last.pop(next(iter(self._last)))
        suppressed = self._suppressed.pop(key, 0)
        self._last[key] = now
        if suppressed:
            message += f" ({suppressed} similar messages suppressed)"
        self.logger.log(level, message, *(cut(a) for a in args), exc_info=exc_info)
        return True
