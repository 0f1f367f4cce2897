"""A run's results.json read back as its writer left it, a run that died told apart: while a run
goes on its results.json says `running` with the writer's pid and machine; one killed -9 never
writes its end, so `running` is read as `died` when that process is gone from this machine."""

from __future__ import annotations

import socket
from pathlib import Path

from dflash_ops.bench.core.results import BenchResult


def read_result(path: Path) -> BenchResult:
    """A results.json as its writer left it; `running` read as `died` when its writer, on this
    machine, is gone (a run killed -9 never wrote its end)."""
    result = BenchResult.model_validate_json(path.read_text())
    if result.status == "running" and result.pid and result.host == socket.gethostname():
        try:
            cmdline = Path(f"/proc/{result.pid}/cmdline").read_bytes()
        except OSError:
            cmdline = b""
        if b"dflash" not in cmdline:
            return result.model_copy(update={"status": "died"})
    return result
