"""The local stack's API keys: files that only the stack's user (and, when it runs as root, its
doors' nginx workers) can read, kept in memory, never on a command line, gone after `local down`.

The doors (nginx, charts/dflash-serve/files/door/door.js) read the key files on every request,
so a rotated key is in force at once. When the stack runs as root, nginx runs its workers as
`nobody` (door_worker): the directory and its files then belong to nobody's group, read-only.
The directory is in /dev/shm (else the temp directory), not in the state directory: the workers
must reach it, which a state directory under a private home (or pytest's 0700 temp root) would
not allow, and a key there never reaches a disk.
"""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import shutil
import stat
import sys
import tempfile
from pathlib import Path

from dflash_ops.errors import UserError

# The key files the doors read (the chart's Secret entries).
CURRENT_KEY, NEXT_KEY = "api-key", "api-key-next"
# The key the router sends to the engines' doors for its own calls (the render endpoints, and
# the paths it proxies with its own key): one of the stack's own, new at every start of the
# stack, so that rotating the clients' key never touches the router.
ROUTER_KEY = "router-key"


def keys_dir(state_dir: Path) -> Path:
    """The key directory of the stack in `state_dir`: one per user and state directory."""
    base = Path("/dev/shm")
    if not (base.is_dir() and os.access(base, os.W_OK | os.X_OK)):
        base = Path(tempfile.gettempdir())
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:16]
    return base / f"dflash-serve-keys-{os.geteuid()}-{digest}"


def door_worker() -> tuple[str, int] | None:
    """When the stack runs as root: nginx's `user` for the doors' workers (nobody and its group)
    and that group's id; else None (the workers run as the stack's user)."""
    if os.geteuid() != 0:
        return None
    try:
        nobody = pwd.getpwnam("nobody")
        group = grp.getgrgid(nobody.pw_gid).gr_name
    except KeyError:
        raise UserError(
            "local up --auth runs as root, and the doors' nginx workers must not: this machine "
            "has no user `nobody` (with a group) to run them as; add one, or run as another user"
        ) from None
    return f"{nobody.pw_name} {group}", nobody.pw_gid


def _own_directory(path: Path) -> None:
    """Create `path` (or take the one there) as this user's, closed to everyone else."""
    worker = door_worker()
    mode = 0o750 if worker else 0o700
    try:
        path.mkdir(mode=mode)
    except FileExistsError:
        pass
    except OSError as err:
        raise UserError(f"cannot create the key directory {path}: {err.strerror}") from None
    found = os.lstat(path)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid():
        raise UserError(
            f"{path} is not a directory of this user's (it may have been made to read the "
            f"stack's keys): remove it (rm -rf {path}), then start again"
        )
    os.chmod(path, mode)
    if worker:
        os.chown(path, -1, worker[1])


def check_key(key: str, where: str) -> str:
    if not key or any(c.isspace() for c in key):
        raise UserError(f"the API key {where} is empty or holds whitespace: give one word")
    return key


def write_key(directory: Path, name: str, key: str) -> None:
    """A key file only its owner (and the doors' workers) reads, replaced in one step: a door
    reading it mid-write would refuse a valid key. Created with its mode: never readable by
    others, not even for a moment."""
    _own_directory(directory)
    partial = directory / f".{name}.partial"
    partial.unlink(missing_ok=True)
    worker = door_worker()
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(key)
        if worker:
            os.fchown(out.fileno(), -1, worker[1])
            os.fchmod(out.fileno(), 0o640)
    partial.replace(directory / name)


def read_key(source: str, what: str) -> str:
    """A key from a file, or from standard input for `-`: one word, trailing newline allowed."""
    if source == "-":
        text = sys.stdin.read()
        where = f"{what} (standard input)"
    else:
        try:
            text = Path(source).read_text()
        except OSError as err:
            raise UserError(f"{what} {source}: cannot read it ({err.strerror})") from None
        where = f"in {what} {source}"
    return check_key(text.strip(), where)


def remove_keys(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
