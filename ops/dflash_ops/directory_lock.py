"""One command at a time on a directory. `local up`, `down` and `rotate-key` change the stack and
its `state.json`; two of them at once start two engines for one port or stop what the other just
started. A bench writes its --out for its whole run; two into one folder lose each other's
records. Each holds an exclusive lock on the directory while it works; a second one is refused
in one line naming the command that holds it (its pid and what it was run as).

The lock is `flock` on a file in the directory: the kernel drops it when its holder exits, even
by kill -9, so a dead command never leaves the directory locked. The file descriptor is not
inherited by the processes the stack starts (Python opens it close-on-exec), so an engine
running on does not hold it either."""

from __future__ import annotations

import fcntl
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dflash_ops.errors import UserError

STACK_LOCK = ".lock"  # up, down, rotate-key: one change of the stack at a time
OWNER_LOCK = ".owner.lock"  # a command that runs stacks in the directory for its whole run
RUN_LOCK = ".bench.lock"  # a bench writing its --out


def _holder(path: Path) -> str:
    try:
        held = json.loads(path.read_text() or "{}")
        return f"`{held['command']}` (pid {held['pid']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another command"


@contextmanager
def holding(state_dir: Path, doing: str, name: str = STACK_LOCK) -> Iterator[None]:
    """Hold the directory's lock `name` while the block runs, or refuse at once: `doing` says
    what this command came to do, for the refusal's line."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / name
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(
                f"cannot {doing}: {_holder(path)} is working on {state_dir}; wait for it to "
                "finish (Ctrl-C stops a starting `local up` and what it started), then run this "
                "again"
            ) from None
        command = " ".join(["dflash-serve", *sys.argv[1:]])[:300]
        os.ftruncate(descriptor, 0)
        os.write(descriptor, json.dumps({"pid": os.getpid(), "command": command}).encode())
        yield
    finally:
        os.close(descriptor)  # the lock goes with it
