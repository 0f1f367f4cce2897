"""`VLLM_API_KEY=KEY dflash-serve local up --auth` with one engine (no router): the chart's door
(real nginx) in front of the real vLLM CPU engine, probed on every route vLLM registers (read from
its own route table) without a key and with a wrong one; with the key, generation works.
(`--replicas 2` with the router: tests/e2e/test_local_replicas.py.)"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from dflash_ops.local import door as door_files
from dflash_ops.local import keys, supervisor
from dflash_ops.loopback import free_port

from tests.conftest import REPO_ROOT
from tests.e2e import route_tables

pytestmark = pytest.mark.e2e
CLI = [sys.executable, "-m", "dflash_ops.cli"]
KEY = "sk-one-engine-5be1"
NEW_KEY = "sk-one-engine-next-93a0"
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
BODY = {"model": "tiny", "prompt": "Count on:", "messages": [{"role": "user", "content": "hi"}],
        "input": "hi", "max_tokens": 4}  # fmt: skip


@pytest.fixture(scope="module")
def ports() -> dict[str, int]:
    return {"engine": free_port(), "sidecar": free_port(), "door-base": free_port()}


class CommandLineWatch:
    """Samples every process's command line (what `ps` shows) while it runs; records the ones
    of the stack (its components carry the supervisor's marker; its commands run dflash_ops)
    that hold any of `secrets`. (The curl a test runs as NOTES prints it is the user's own.)"""

    def __init__(self, *secrets: str) -> None:
        self.secrets = [s.encode() for s in secrets]
        self.found: list[str] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    line = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                if any(secret in line for secret in self.secrets) and _of_the_stack(entry, line):
                    self.found.append(line.replace(b"\0", b" ").decode(errors="replace"))
            self.samples += 1
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _of_the_stack(process: Path, command_line: bytes) -> bool:
    if b"dflash_ops" in command_line:
        return True
    try:
        return f"{supervisor.MARKER_VARIABLE}=".encode() in (process / "environ").read_bytes()
    except OSError:
        return True  # gone: count it


@dataclass
class Door:
    url: str
    state_dir: Path
    watch: CommandLineWatch


@pytest.fixture(scope="module")
def door(
    tmp_path_factory: pytest.TempPathFactory, models_dir: Path, ports: dict[str, int]
) -> Iterator[Door]:
    """`VLLM_API_KEY=KEY local up --auth`: the key from the environment, as a user who keeps it
    off the command line starts the stack. The engine must not inherit it (vLLM would check it
    itself, behind the door, and the stack's key-less probes would never see it ready). Every
    command line is watched for the key from the start to after `local down`, which must leave
    no key behind."""
    state_dir = tmp_path_factory.mktemp("door")
    (state_dir / "models").symlink_to(models_dir)
    port = ports["engine"]
    up = [
        *CLI, "local", "up", "--state-dir", str(state_dir), "--method", "off",
        "--enforce-eager", "--no-prometheus", "--engine-port", str(port),
        "--sidecar-port", str(ports["sidecar"]), "--door-base-port", str(ports["door-base"]),
        "--auth",
    ]  # fmt: skip
    # One sidecar canary at start, then none for an hour: the probe holds the token counters still.
    env = {**os.environ, "DFLASH_SIDECAR_CANARY_INTERVAL": "3600", "VLLM_API_KEY": KEY}
    watch = CommandLineWatch(KEY, NEW_KEY)
    keys_dir = keys.keys_dir(state_dir)
    done = subprocess.run(up, capture_output=True, text=True, timeout=1200, env=env)
    try:
        assert done.returncode == 0, done.stderr[-4000:]
        yield Door(f"http://127.0.0.1:{port}", state_dir, watch)
    finally:
        down = subprocess.run([*CLI, "local", "down", "--state-dir", str(state_dir)], timeout=300)
        watch.stop()
    assert down.returncode == 0
    assert not keys_dir.exists(), sorted(keys_dir.iterdir())
    leftovers = [p for p in state_dir.rglob("*") if p.is_file() and _holds(p, KEY, NEW_KEY)]
    assert not leftovers, leftovers
    assert watch.samples > 10 and not watch.found, watch.found[:3]


def _holds(path: Path, *secrets: str) -> bool:
    try:
        data = path.read_bytes()
    except OSError:
        return False
    return any(s.encode() in data for s in secrets)


@pytest.fixture(scope="module")
def door_url(door: Door) -> str:
    return door.url


def generated_tokens(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(("vllm:generation_tokens_total", "vllm:prompt_tokens_total"))
    )


@pytest.mark.parametrize("key", [None, "sk-wrong"], ids=["no-key", "wrong-key"])
def test_without_a_valid_key_only_health_and_metrics_answer(door_url: str, key: str | None) -> None:
    routes = {route_tables.concrete(p) for p in route_tables.vllm_routes(
        REPO_ROOT / ".venv" / "bin" / "python")}  # fmt: skip
    assert {"/invocations", "/v1/chat/completions", "/v1/messages"} <= routes
    open_paths = set(door_files.door_paths()["open"]["engine"])
    # One connection per request (see test_local_replicas.probe).
    headers = {"Connection": "close", **({"Authorization": f"Bearer {key}"} if key else {})}
    before = generated_tokens(door_url)
    with httpx.Client(timeout=30) as client:

        def one(job: tuple[str, str]) -> str | None:
            method, path = job
            body = BODY if method in ("POST", "PUT", "PATCH") else None
            status = client.request(method, door_url + path, json=body, headers=headers)
            code = status.status_code
            if 200 <= code < 300 and path not in open_paths:
                return f"{method} {path}: {code}"
            if path == "/invocations" and code != 404:
                return f"{method} {path}: {code}"
            return None

        with ThreadPoolExecutor(8) as pool:
            jobs = [(m, p) for m in METHODS for p in sorted(routes)]
            problems = [p for p in pool.map(one, jobs) if p]
    assert not problems, problems[:20]
    assert generated_tokens(door_url) == before


def test_with_the_key_it_generates(door_url: str) -> None:
    bearer = {"Authorization": f"Bearer {KEY}"}
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    reply = httpx.post(door_url + "/v1/chat/completions", json=chat, headers=bearer, timeout=120)
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] > 0
    assert httpx.get(door_url + "/health", timeout=10).status_code == 200


def notes_command(notes: str, starts: str) -> str:
    """The shell command of NOTES that starts with `starts`, with its continuation lines."""
    lines = notes.splitlines()
    first = next(i for i, line in enumerate(lines) if line.strip().startswith(starts))
    command = [lines[first]]
    while command[-1].rstrip().endswith("\\"):
        command.append(lines[first + len(command)])
    return "\n".join(command)


def test_the_notes_commands_work_as_printed_against_the_door(
    door_url: str, ports: dict[str, int], tmp_path: Path
) -> None:
    """NOTES.txt of a release with a key, its ports set to the local stack's: the curl commands
    it prints, run by bash as a user pastes them, with a kubectl that answers what the
    cluster's would (the Secret's entry, base64) and records what it was asked."""
    import base64

    from dflash_ops.chart.helm import helm_binary
    from dflash_ops.paths import CHART_DIR

    rendered = subprocess.run(
        [helm_binary(), "install", "t", str(CHART_DIR), "--dry-run=client", "--namespace", "llm",
         "--set", "auth.apiKeySecret.name=vllm-api-key", "--set", "model.servedName=tiny",
         "--set", f"service.port={ports['engine']}", "--set", f"sidecar.port={ports['sidecar']}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    notes = rendered.stdout.split("\nNOTES:\n", 1)[1]
    shim = tmp_path / "bin"
    shim.mkdir()
    asked = tmp_path / "kubectl-args"
    kubectl = shim / "kubectl"
    secret = base64.b64encode(KEY.encode()).decode()
    kubectl.write_text(f'#!/bin/sh\necho "$*" >> {asked}\necho -n {secret}\n')
    kubectl.chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}"}

    chat = notes_command(notes, "curl http://127.0.0.1:")
    assert "Authorization: Bearer" in chat, notes
    done = subprocess.run(
        ["bash", "-c", chat], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["choices"][0]["message"]["role"] == "assistant", done.stdout
    # The key came from the release's Secret, its api-key entry, in its namespace.
    assert asked.read_text().split() == [
        "-n", "llm", "get", "secret", "vllm-api-key", "-o", "jsonpath={.data.api-key}",
    ]  # fmt: skip

    # The sidecar's readiness as NOTES prints it; on a loaded machine one of its probes may time
    # out and say "down" for a moment, so the command is run until it reports ready (or 2 min).
    sidecar = notes_command(notes, f"curl http://127.0.0.1:{ports['sidecar']}/readyz")
    deadline = time.monotonic() + 120
    while True:
        done = subprocess.run(["bash", "-c", sidecar], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        if '"ready":true' in done.stdout.replace(" ", "") or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert '"ready":true' in done.stdout.replace(" ", ""), done.stdout


def test_the_key_files_are_closed_to_others_and_a_rotation_reads_keys_from_stdin(
    door: Door,
) -> None:
    directory = keys.keys_dir(door.state_dir)
    assert door.state_dir not in directory.parents
    for path in [directory, *directory.iterdir()]:
        mode = path.stat().st_mode
        assert stat.S_IMODE(mode) & 0o007 == 0, (path, oct(mode))
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

    def status(key: str) -> int:
        bearer = {"Authorization": f"Bearer {key}"}
        url = door.url + "/v1/chat/completions"
        return httpx.post(url, json=chat, headers=bearer, timeout=120).status_code

    rotate = [*CLI, "local", "rotate-key", "--state-dir", str(door.state_dir)]

    def rotate_to(key: str) -> None:
        subprocess.run([*rotate, "--key-file", "-"], input=key + "\n", text=True, check=True,
                       timeout=60)  # fmt: skip
        assert status(key) == 200
        subprocess.run([*rotate, "--finish"], check=True, timeout=60)

    rotate_to(NEW_KEY)
    assert (status(NEW_KEY), status(KEY)) == (200, 401)
    rotate_to(KEY)  # back, for the other tests of this module
    assert (status(KEY), status(NEW_KEY)) == (200, 401)


def test_a_key_in_the_url_reaches_no_log_and_paths_match_with_their_case(door: Door) -> None:
    """vLLM's access log writes each request line (a marker in a query string shows it); a URL
    that carries the key is refused at the door, before anything logs it."""
    bearer = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=door.url, timeout=30, headers=bearer) as client:
        assert client.get("/v1/models?after=marker-5e2").status_code == 200
        for url in (f"/v1/models?api_key={KEY}", f"/v1/models?x={KEY}", f"/v1/models/{KEY}"):
            assert client.get(url).status_code == 400, url
        assert client.get("/health").status_code == 200
        assert client.get("/HEALTH").status_code == 404
        assert client.get("/V1/models").status_code == 404
    logs = sorted(door.state_dir.glob("*.log"))
    deadline = time.monotonic() + 10
    while not any(_holds(p, "marker-5e2") for p in logs) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert any(_holds(p, "marker-5e2") for p in logs), logs
    assert not [p for p in logs if _holds(p, KEY)]
