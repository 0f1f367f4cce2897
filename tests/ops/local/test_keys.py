"""The local stack's keys (dflash_ops.local.keys): files nobody else reads, in memory, never on a
command line or in a component's environment, gone after `local down`."""

from __future__ import annotations

import contextlib
import io
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from dflash_ops.cli import main
from dflash_ops.errors import UserError
from dflash_ops.local import keys, stack, supervisor
from dflash_ops.local.router import keyed_router_argv, router_argv
from dflash_ops.loopback import free_port

KEY = "sk-local-41d0"


@pytest.fixture()
def key_dir(tmp_path: Path) -> Iterator[Path]:
    directory = keys.keys_dir(tmp_path / "state")
    yield directory
    keys.remove_keys(directory)


def test_the_key_directory_is_in_memory_one_per_state_directory(tmp_path: Path) -> None:
    one, two = keys.keys_dir(tmp_path / "a"), keys.keys_dir(tmp_path / "b")
    assert one != two and one == keys.keys_dir(tmp_path / "a" / ".." / "a")
    assert tmp_path not in one.parents
    if Path("/dev/shm").is_dir():
        assert one.parent == Path("/dev/shm")
    cfg = stack.StackConfig(state_dir=tmp_path / "a", auth=True)
    assert cfg.keys_dir == one


def test_a_key_file_is_for_its_owner_and_the_doors_workers_only(key_dir: Path) -> None:
    keys.write_key(key_dir, keys.CURRENT_KEY, KEY)
    keys.write_key(key_dir, keys.CURRENT_KEY, KEY + "-2")  # replaced in place
    path = key_dir / keys.CURRENT_KEY
    assert path.read_text() == KEY + "-2"
    assert sorted(p.name for p in key_dir.iterdir()) == [keys.CURRENT_KEY]  # no partial left
    found, directory = path.stat(), key_dir.stat()
    assert found.st_uid == directory.st_uid == os.geteuid()
    assert stat.S_IMODE(found.st_mode) & 0o007 == 0 and stat.S_IMODE(directory.st_mode) & 0o007 == 0
    worker = keys.door_worker()
    if worker is None:
        assert stat.S_IMODE(found.st_mode) == 0o600 and stat.S_IMODE(directory.st_mode) == 0o700
    else:  # root: nginx's workers run as nobody and read through nobody's group
        assert (found.st_gid, stat.S_IMODE(found.st_mode)) == (worker[1], 0o640)
        assert (directory.st_gid, stat.S_IMODE(directory.st_mode)) == (worker[1], 0o750)


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a directory to another user needs root")
def test_a_key_directory_someone_else_made_is_refused(key_dir: Path) -> None:
    key_dir.mkdir(mode=0o777)
    os.chown(key_dir, 65534, -1)
    with pytest.raises(UserError, match="not a directory of this user's"):
        keys.write_key(key_dir, keys.CURRENT_KEY, KEY)
    assert not (key_dir / keys.CURRENT_KEY).exists()


def test_a_symlink_in_place_of_the_key_directory_is_refused(key_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    key_dir.symlink_to(tmp_path / "elsewhere")
    try:
        with pytest.raises(UserError, match="not a directory of this user's"):
            keys.write_key(key_dir, keys.CURRENT_KEY, KEY)
        assert not list((tmp_path / "elsewhere").iterdir())
    finally:
        key_dir.unlink()


def test_keys_are_read_from_a_file_or_standard_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "key").write_text(KEY + "\n")
    assert keys.read_key(str(tmp_path / "key"), "--api-key-file") == KEY
    monkeypatch.setattr(sys, "stdin", io.StringIO(KEY + "\n"))
    assert keys.read_key("-", "--key-file") == KEY
    (tmp_path / "two").write_text("sk-a sk-b\n")
    for source, problem in (("two", "whitespace"), ("missing", "cannot read it")):
        with pytest.raises(UserError, match=problem) as raised:
            keys.read_key(str(tmp_path / source), "--api-key-file")
        assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    "args",
    [
        ["local", "up", "--api-key-file", "/nonexistent/key"],
        ["local", "rotate-key", "--key-file", "/nonexistent/key"],
        ["local", "rotate-key", "NEW", "--finish"],
        ["local", "rotate-key"],
    ],
)
def test_bad_key_arguments_get_one_line(
    args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*args, "--state-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "error:" in err, err
    assert not list(tmp_path.iterdir())


def test_a_key_and_a_key_file_together_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["local", "up", "--api-key", KEY, "--api-key-file", "-"])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_no_component_inherits_a_key_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("DFLASH_KEEP_ME", "1")
    env = supervisor.component_environment({"VLLM_CPU_KVCACHE_SPACE": "1"}, "m")
    assert KEY not in env.values()
    assert env["DFLASH_KEEP_ME"] == "1" and env[supervisor.MARKER_VARIABLE] == "m"


@pytest.mark.parametrize("saved", [True, False], ids=["with-state", "up-killed-before-a-state"])
def test_down_removes_the_keys(tmp_path: Path, saved: bool) -> None:
    cfg = stack.StackConfig(state_dir=tmp_path, auth=True)
    keys.write_key(cfg.keys_dir, keys.CURRENT_KEY, KEY)
    if saved:
        stack._save_state(stack.StackState(config=cfg, processes=[]))
    stack.down(tmp_path, quiet=True)
    assert not cfg.keys_dir.exists()


class Worker(ThreadingHTTPServer):
    """A stand-in engine for the router: answers 200 and records each path's Authorization."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None]] = []
        worker = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                worker.seen.append((self.path, self.headers.get("Authorization")))
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = b'{"ok": true}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


def test_the_router_gets_its_key_from_its_file_never_on_a_command_line(
    tmp_path: Path, key_dir: Path
) -> None:
    """The real vllm-router, started as the stack starts it with auth: /proc never shows its key
    (sampled from the spawn until it serves), and it sends the key to the engines."""
    keys.write_key(key_dir, keys.ROUTER_KEY, KEY)
    worker = Worker()
    port = free_port()
    argv = router_argv(
        [f"http://127.0.0.1:{worker.server_address[1]}"], "round_robin", port, free_port()
    )
    argv = keyed_router_argv(argv, key_dir / keys.ROUTER_KEY)
    assert KEY not in " ".join(argv)
    log = (tmp_path / "router.log").open("wb")
    router = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    shown: set[bytes] = set()
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError):
                shown.add(Path(f"/proc/{router.pid}/cmdline").read_bytes())
            assert router.poll() is None, (tmp_path / "router.log").read_text()
            try:
                reply = httpx.post(
                    f"http://127.0.0.1:{port}/v1/messages", json={"model": "m"}, timeout=5
                )
                if reply.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "vllm-router did not serve within 60 s"
            time.sleep(0.02)
    finally:
        router.terminate()
        router.wait(timeout=30)
        log.close()
        worker.shutdown()
    assert len(shown) >= 1 and not [c for c in shown if KEY.encode() in c]
    assert ("/v1/messages", f"Bearer {KEY}") in worker.seen
