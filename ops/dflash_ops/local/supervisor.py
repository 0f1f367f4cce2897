"""A small process supervisor: each component in a session of its own with its log, trusted
by pid only while /proc shows the command line it was started with, stopped as a whole process
group (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from dflash_ops.errors import UserError


class ProcessRecord(BaseModel):
    name: str
    pid: int
    url: str
    log: str
    argv: list[str]


def say(message: str) -> None:
    print(f"[local] {message}", file=sys.stderr, flush=True)


def alive(record: ProcessRecord) -> bool:
    """The component's own process (the group leader) runs the recorded command line."""
    try:
        cmdline = Path(f"/proc/{record.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return [c.decode(errors="replace") for c in cmdline if c] == record.argv


def group_members(record: ProcessRecord) -> list[int]:
    """Live processes of the component's process group (its session), the leader included:
    vLLM's engine core and workers outlive an API server killed with SIGKILL."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[2] == str(record.pid) and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def spawn(
    name: str,
    argv: list[str],
    url: str,
    log_path: Path,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> ProcessRecord:
    if cwd is not None:
        cwd.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=cwd,
            env=os.environ | (env or {}),
        )
    record = ProcessRecord(name=name, pid=process.pid, url=url, log=str(log_path), argv=argv)
    # /proc shows the command line only once exec has finished; wait for it (or for an exit).
    deadline = time.monotonic() + 5
    while not alive(record) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return record


def wait_ready(record: ProcessRecord, ready: Callable[[], bool], timeout: float, what: str) -> None:
    started = time.monotonic()
    last_report = 0.0
    while not ready():
        elapsed = time.monotonic() - started
        if not alive(record):
            tail = Path(record.log).read_text(errors="replace").splitlines()[-15:]
            raise UserError(
                f"{record.name} exited while {what}; last log lines:\n  " + "\n  ".join(tail)
            )
        if elapsed > timeout:
            raise UserError(
                f"{record.name} not ready after {timeout:.0f}s ({what}); see {record.log}"
            )
        if elapsed - last_report >= 10:
            last_report = elapsed
            lines = Path(record.log).read_text(errors="replace").splitlines()
            last = lines[-1][:110] if lines else ""
            say(f"{what}: {elapsed:.0f}s  {last}")
        time.sleep(1.0)
    say(f"{record.name} ready after {time.monotonic() - started:.0f}s at {record.url}")


def check_port_free(host: str, port: int, what: str, flag: str) -> None:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            raise UserError(
                f"port {port} ({what}) is in use by another process: stop it or pass {flag}"
            ) from None


def stop_process(record: ProcessRecord, grace_s: float = 30.0) -> bool:
    """SIGTERM the component's process group, SIGKILL what is left after `grace_s`; False if
    nothing of it was running. The group is stopped whenever any member survives."""
    if not group_members(record):
        return False
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(record.pid, sig)
        deadline = time.monotonic() + wait_s
        while group_members(record) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not group_members(record):
            break
    return True
