"""A small process supervisor: each component in a session of its own with its log, stopped as
a whole process group (SIGTERM, then SIGKILL).

A recorded pid is trusted only while it is provably ours: the leader must show the recorded
command line and start time, and a group member must carry the component's marker in its
environment (`DFLASH_LOCAL_PROCESS`, inherited by vLLM's engine core and workers). A stale state
file whose pid now leads a stranger's process group therefore never gets that group signalled.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from dflash_ops.errors import UserError

MARKER_VARIABLE = "DFLASH_LOCAL_PROCESS"


def is_key_variable(name: str) -> bool:
    """A variable that carries an API key (VLLM_API_KEY, OPENAI_API_KEY, ...): no process of
    the stack inherits one. VLLM_API_KEY would turn on vLLM's own key check behind the door,
    where the stack's readiness probes carry no key; the others are no business of theirs."""
    return name.upper().endswith(("API_KEY", "API_KEYS"))


def component_environment(extra: dict[str, str] | None, marker: str) -> dict[str, str]:
    """A component's environment: the caller's without its key variables, then `extra`."""
    inherited = {k: v for k, v in os.environ.items() if not is_key_variable(k)}
    return inherited | (extra or {}) | {MARKER_VARIABLE: marker}


class ProcessRecord(BaseModel):
    name: str
    pid: int
    url: str
    log: str
    argv: list[str]
    marker: str = ""  # DFLASH_LOCAL_PROCESS of the component's processes
    start_time: int | None = None  # the leader's start, clock ticks after boot (/proc stat)
    # The title a program gives itself in place of its command line (setproctitle), if it does.
    title: str | None = None
    # (pid, start time) of every process of its group when it became ready: vLLM's EngineCore
    # calls setproctitle, which overwrites the environment /proc shows, marker included; a
    # process remembered here is the component's whatever it has done to its environment.
    members: list[tuple[int, int]] = []


def _stat_fields(pid: int | str) -> list[str] | None:
    """Fields of /proc/<pid>/stat after `pid (comm)` (comm may hold spaces and parentheses)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def _has_marker(pid: int | str, marker: str) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{MARKER_VARIABLE}={marker}".encode() in environ.split(b"\0")


def say(message: str) -> None:
    print(f"[local] {message}", file=sys.stderr, flush=True)


def alive(record: ProcessRecord) -> bool:
    """The component's own process (the group leader) runs: the recorded command line and, when
    recorded, the same start time (a pid reused for the same command is another process)."""
    try:
        cmdline = Path(f"/proc/{record.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    shown = [c.decode(errors="replace") for c in cmdline if c]
    if shown != record.argv and (record.title is None or shown != [record.title]):
        return False
    return record.start_time is None or start_time(record.pid) == record.start_time


def group_members(record: ProcessRecord) -> list[int]:
    """Live processes of the component's process group (its session), the leader included:
    vLLM's engine core and workers outlive an API server killed with SIGKILL. Only processes
    that are provably the component's count (its marker; for a record without one, a group
    whose leader is still the recorded process)."""
    if not record.marker and not alive(record):
        return []
    remembered = {tuple(m) for m in record.members}
    members = []
    for pid, fields in _group(record.pid):
        # setproctitle (vllm-router) overwrites the environment /proc shows with the title:
        # such a leader is known by its title and start time instead of its marker.
        renamed_leader = record.title and pid == record.pid and alive(record)
        known = (pid, int(fields[19])) in remembered if len(fields) > 19 else False
        if known or renamed_leader or not record.marker or _has_marker(pid, record.marker):
            members.append(pid)
    return members


def _group(pgid: int) -> list[tuple[int, list[str]]]:
    """Live (not zombie) processes whose process group is `pgid`, with their stat fields."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry.name)
        # state ppid pgrp ...
        if fields is None or len(fields) < 3 or fields[2] != str(pgid) or fields[0] == "Z":
            continue
        found.append((int(entry.name), fields))
    return found


def process_group(pgid: int) -> list[int]:
    """Live processes of the process group `pgid`."""
    return [pid for pid, _ in _group(pgid)]


def remember_members(record: ProcessRecord) -> ProcessRecord:
    """The record with every process of its group now remembered (call it once the component
    is ready, its leader alive: while the leader lives no stranger can hold its group id)."""
    if not alive(record):
        return record
    members = [(pid, int(f[19])) for pid, f in _group(record.pid) if len(f) > 19]
    return record.model_copy(update={"members": members})


def scope_of(state_dir: Path) -> str:
    """The stack a process belongs to, in its marker: every process a stack starts carries
    `<scope>/<name>-<uuid>`, so one killed before state.json named it is still found."""
    return hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:16]


def strays(scope: str, known: set[int]) -> list[int]:
    """Live processes marked as the stack `scope`'s that no record in `known` accounts for:
    spawned by a `local up` killed before it could write them down."""
    found = []
    prefix = f"{MARKER_VARIABLE}={scope}/".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in known:
            continue
        try:
            environ = Path(f"/proc/{entry.name}/environ").read_bytes()
        except OSError:
            continue
        fields = _stat_fields(entry.name)
        if fields is None or fields[0] == "Z":
            continue
        if any(item.startswith(prefix) for item in environ.split(b"\0")):
            found.append(int(entry.name))
    return found


def stop_strays(scope: str, known: set[int], grace_s: float = 10.0) -> list[int]:
    """SIGTERM the process groups of `strays`, SIGKILL what is left after `grace_s`."""
    found = strays(scope, known)
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(os.getpgid(pid), sig)
        deadline = time.monotonic() + wait_s
        while strays(scope, known) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not strays(scope, known):
            break
    return found


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
    title: str | None = None,
    scope: str = "",
) -> ProcessRecord:
    if cwd is not None:
        cwd.mkdir(parents=True, exist_ok=True)
    marker = f"{scope}/{name}-{uuid.uuid4().hex}" if scope else f"{name}-{uuid.uuid4().hex}"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=cwd,
            env=component_environment(env, marker),
        )
    record = ProcessRecord(
        name=name,
        pid=process.pid,
        url=url,
        log=str(log_path),
        argv=argv,
        marker=marker,
        start_time=start_time(process.pid),
        title=title,
    )
    # /proc shows the command line only once exec has finished; wait for it (or for an exit).
    deadline = time.monotonic() + 5
    while not alive(record) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return record


def wait_ready(
    record: ProcessRecord,
    ready: Callable[[], bool],
    timeout: float,
    what: str,
    started: float | None = None,
) -> None:
    """Wait until `ready()`, at most `timeout` seconds after `started` (time.monotonic() of the
    spawn; now if None), reporting every 10 s; a UserError if the process exits or times out."""
    started = time.monotonic() if started is None else started
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
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as err:
        raise UserError(
            f"--host {host!r} is not an address or a name this machine resolves: {err}"
        ) from None
    with socket.socket(family) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise UserError(
                    f"port {port} ({what}) is in use by another process: stop it or pass {flag}"
                ) from None
            raise UserError(
                f"cannot listen on {host}:{port} ({what}): {err.strerror}; --host must be an "
                "address of this machine (127.0.0.1, or 0.0.0.0 for every interface)"
            ) from None


def stop_process(record: ProcessRecord, grace_s: float = 30.0) -> bool:
    """SIGTERM the component's process group, SIGKILL what is left after `grace_s`; False if
    nothing of it was running. The group is stopped whenever any member survives: while one of
    its members lives, the kernel never hands its group id to another process group."""
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
