"""The local stack beside strangers on its default ports (tests/conftest.py keeps one on each
for the whole session, as a `make demo` stack or a user's other server would)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
from dflash_ops.errors import UserError
from dflash_ops.local import engine, stack
from dflash_ops.loopback import free_port

from tests.conftest import DEFAULT_PORTS, _claim_free_default_ports

LINE_BUSY = "is in use by another process: stop it or pass"


def stack_default_ports() -> set[int]:
    one = stack.StackConfig()
    two = stack.StackConfig(replicas=2)
    ports = {one.engine_port, one.sidecar_port, one.prometheus_port, two.router_metrics_port}
    for i in range(two.replicas):
        ports |= {two.engine_port_of(i), two.sidecar_port_of(i)}
    return ports


def answers(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def stranger_still_there(port: int) -> bool:
    """Our session's stranger answers 404 naming itself; another listener just answers."""
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
    except urllib.error.HTTPError as err:
        return err.code == 404 or answers(port)
    except OSError:
        return answers(port)
    return True


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFLASH_")}
    return subprocess.run(
        [sys.executable, "-m", "dflash_ops.cli", *args],
        capture_output=True, text=True, timeout=120, cwd=cwd, env=env,
    )  # fmt: skip


def test_the_strangers_cover_every_default_port_of_the_stack() -> None:
    assert stack_default_ports() == set(DEFAULT_PORTS)


def test_every_default_port_is_taken_while_the_suite_runs() -> None:
    taken = [port for port in DEFAULT_PORTS if answers(port)]
    assert taken == list(DEFAULT_PORTS)


def test_a_default_port_freed_mid_session_gets_a_stranger_before_the_next_test() -> None:
    """Another suite's stranger (or a `make demo` stack) that goes away mid-session leaves no
    default port free for the tests after it: the claim that runs before each test takes a
    freed port again. Shown on a port of this test's own (under `make check`'s two workers the
    session's strangers may belong to the other worker)."""
    port = free_port()
    servers: list[ThreadingHTTPServer] = []
    try:
        _claim_free_default_ports(servers, (port,))  # the session's first claim
        assert answers(port) and stranger_still_there(port)
        servers[0].shutdown()
        servers[0].server_close()
        servers.clear()
        assert not answers(port)  # gone mid-session
        _claim_free_default_ports(servers, (port,))  # what runs before each test
        assert answers(port) and stranger_still_there(port)
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


@pytest.mark.parametrize(
    ("flags", "named"),
    [([], "port 8000 (engine)"), (["--replicas", "2"], "port 8100 (engine-0)")],
)
def test_local_up_on_the_default_ports_names_the_busy_one_and_builds_nothing(
    tmp_path: Path, flags: list[str], named: str
) -> None:
    done = cli("local", "up", "--no-prometheus", *flags, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert named in line and LINE_BUSY in line, line
    assert not (tmp_path / ".local-stack" / "models").exists()  # nothing built
    assert all(stranger_still_there(port) for port in DEFAULT_PORTS)  # nobody was signalled


def test_status_and_down_in_a_fresh_directory_leave_the_strangers_alone(tmp_path: Path) -> None:
    status = cli("local", "status", cwd=tmp_path)
    assert status.returncode == 1 and "not running" in status.stdout, status.stderr
    down = cli("local", "down", cwd=tmp_path)
    assert down.returncode == 0 and "Traceback" not in down.stderr, down.stderr
    assert all(stranger_still_there(port) for port in DEFAULT_PORTS)


def test_a_missing_engine_is_named_before_a_busy_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the engine, a user learns that first, not to free port 8000 for it."""
    assert answers(8000)
    monkeypatch.setattr(engine, "ENGINE_MODULES", ("no_such_engine_package",))
    with pytest.raises(UserError, match=r"runs a real vLLM CPU engine.*no_such_engine_package"):
        stack.up(stack.StackConfig(state_dir=tmp_path, prometheus=False))
    assert not (tmp_path / "models").exists()
