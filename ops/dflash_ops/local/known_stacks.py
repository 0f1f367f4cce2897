"""Where this user's local stacks live, so `local status` run from another directory can say
where the stack is instead of "not running": `local up` adds its state directory (absolute) to
`$XDG_STATE_HOME/dflash-serve/stacks` (~/.local/state when unset), `local down` removes it.
The list is rewritten under its own lock, atomically; a directory whose stack is gone without a
`down` (a reboot) is dropped when it is next read."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def registry() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "dflash-serve" / "stacks"


@contextmanager
def _locked() -> Iterator[Path]:
    path = registry()
    path.parent.mkdir(parents=True, exist_ok=True)
    with (path.parent / ".stacks.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield path


def _read(path: Path) -> list[str]:
    try:
        return [line for line in path.read_text().splitlines() if line.strip()]
    except OSError:
        return []


def _write(path: Path, entries: list[str]) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text("".join(f"{entry}\n" for entry in entries))
    os.replace(partial, path)


def add(state_dir: Path) -> None:
    try:
        with _locked() as path:
            entries = _read(path)
            where = str(state_dir.resolve())
            if where not in entries:
                _write(path, [*entries, where])
    except OSError:
        pass  # a read-only home: status just cannot point elsewhere


def remove(state_dir: Path) -> None:
    try:
        with _locked() as path:
            where = str(state_dir.resolve())
            _write(path, [e for e in _read(path) if e != where])
    except OSError:
        pass


def running_elsewhere(state_dir: Path) -> list[Path]:
    """Known state directories other than `state_dir` that still hold a stack's state."""
    here = state_dir.resolve()
    try:
        with _locked() as path:
            entries = _read(path)
            live = [e for e in entries if (Path(e) / "state.json").is_file()]
            if live != entries:
                _write(path, live)
    except OSError:
        return []
    return [Path(e) for e in live if Path(e) != here]
