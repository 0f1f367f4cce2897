"""The door's files (dflash_ops.local.door, charts/dflash-serve/files/door/) run by the real nginx
with its JavaScript module, in front of a recording upstream on loopback: paths match with their
case, a key in the URL is refused before anything logs it, and the workers of a door started as
root do not run as root yet read the stack's key files."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from dflash_ops.local import door, keys
from dflash_ops.loopback import free_port

KEY = "sk-door-7c1e"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
pytestmark = pytest.mark.skipif(
    not (Path(NGINX).exists() and door.NJS_MODULE.is_file()),
    reason="needs nginx with its JavaScript module (make setup installs them)",
)


class Recorder(ThreadingHTTPServer):
    """What the door guards: answers 200 to everything and records the request lines."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                recorder.seen.append(f"{self.command} {self.path}")
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                body = b'{"ok": true}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


@dataclass
class RunningDoor:
    url: str
    log: Path
    process: subprocess.Popen[bytes]
    recorder: Recorder | None = field(default=None)


@contextlib.contextmanager
def running_door(
    tmp_path: Path, keys_dir: Path, upstream_port: int, worker_user: str | None
) -> Iterator[RunningDoor]:
    port = free_port()
    config = door.DoorConfig(
        role="engine",
        listen=f"127.0.0.1:{port}",
        upstream_port=upstream_port,
        keys_dir=str(keys_dir),
        key_names=(keys.CURRENT_KEY, keys.NEXT_KEY),
        keyed_paths=door.default_keyed_paths(),
        timeout_s=30,
        shutdown_timeout_s=5,
        worker_user=worker_user,
    )
    conf = door.write_conf(config, tmp_path / "conf")
    log_path = tmp_path / "door.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            door.nginx_argv(NGINX, tmp_path, conf), stdout=log, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:  # until nginx listens
            assert process.poll() is None, log_path.read_text()
            try:
                httpx.get(url + "/nowhere", timeout=5)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "nginx did not listen within 30 s"
                time.sleep(0.1)
        yield RunningDoor(url, log_path, process)
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture()
def key_dir(tmp_path: Path) -> Iterator[Path]:
    directory = keys.keys_dir(tmp_path / "state")
    keys.write_key(directory, keys.CURRENT_KEY, KEY)
    yield directory
    keys.remove_keys(directory)


def worker_user() -> str | None:
    worker = keys.door_worker()
    return worker[0] if worker else None


BEARER = {"Authorization": f"Bearer {KEY}"}


def test_paths_match_with_their_case(tmp_path: Path, key_dir: Path) -> None:
    recorder = Recorder()
    upstream = recorder.server_address[1]
    with (
        running_door(tmp_path, key_dir, upstream, worker_user()) as running,
        httpx.Client(base_url=running.url, timeout=10) as client,
    ):
        assert client.get("/health").status_code == 200
        assert client.get("/v1/models", headers=BEARER).status_code == 200
        assert recorder.seen == ["GET /health", "GET /v1/models"]
        for path in ("/HEALTH", "/Health", "/METRICS", "/V1/models", "/v1/Models"):
            assert client.get(path, headers=BEARER).status_code == 404, path
        chat = client.post("/v1/Chat/Completions", headers=BEARER, json={})
        assert chat.status_code == 404
    recorder.shutdown()
    assert recorder.seen == ["GET /health", "GET /v1/models"]


def test_a_key_in_the_url_is_refused_and_reaches_no_log(tmp_path: Path, key_dir: Path) -> None:
    """Nothing listens behind this door, so every request it proxies is logged with its request
    line (connect() failed): a marker in a query string shows that the log would keep a key."""
    with running_door(tmp_path, key_dir, free_port(), worker_user()) as running:
        with httpx.Client(base_url=running.url, timeout=10) as client:
            proxied = client.get("/v1/models?after=visible-7f3", headers=BEARER)
            assert proxied.status_code == 502
            for url in (
                f"/v1/models?api_key={KEY}",
                f"/v1/models?key={KEY}",
                f"/v1/models?x=1&note={KEY}",
                f"/v1/models?x=Bearer%20{KEY}",
                f"/v1/models?Token={KEY[::-1]}",
                "/v1/models?access-token=abc&x=1",
                f"/v1/models/{KEY}",
                f"/health?k={KEY}",
            ):
                refused = client.get(url, headers=BEARER)
                assert refused.status_code == 400, (url, refused.text)
                assert "Authorization: Bearer" in refused.json()["error"]["message"]
            chat = client.post(f"/v1/chat/completions?apikey={KEY}", headers=BEARER, json={})
            assert chat.status_code == 400
        deadline = time.monotonic() + 5
        while "visible-7f3" not in running.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
    log = running.log.read_text()
    assert "visible-7f3" in log, log[-2000:]
    assert KEY not in log and KEY[::-1] not in log, log[-2000:]


@pytest.mark.skipif(os.geteuid() != 0, reason="a door started by a user other than root")
def test_a_door_started_as_root_runs_its_workers_as_nobody(tmp_path: Path, key_dir: Path) -> None:
    recorder = Recorder()
    user = worker_user()
    assert user is not None and user.split()[0] == "nobody"
    with running_door(tmp_path, key_dir, recorder.server_address[1], user) as running:
        workers = [
            int(p.name)
            for p in Path("/proc").iterdir()
            if p.name.isdigit() and _parent(int(p.name)) == running.process.pid
        ]
        assert workers
        for pid in workers:
            assert _uid(pid) != 0, f"nginx worker {pid} runs as root"
        # ... and read the key files, only their owner's and the workers' group's to read.
        with httpx.Client(base_url=running.url, timeout=10) as client:
            assert client.get("/v1/models", headers=BEARER).status_code == 200
            assert client.get("/v1/models").status_code == 401
    recorder.shutdown()
    mode = (key_dir / keys.CURRENT_KEY).stat().st_mode
    assert mode & 0o007 == 0, oct(mode)


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2 :].split()[1])


def _uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[2])  # effective
    raise AssertionError(f"no Uid line for {pid}")
