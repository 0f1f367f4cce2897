"""`dflash-serve local up --api-key KEY` with one engine (no router): the chart's door (real
nginx) in front of the real vLLM CPU engine, probed on every route vLLM registers (read from its
own route table) without a key and with a wrong one; with the key, generation works.
(`--replicas 2` with the router: tests/e2e/test_local_replicas.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from dflash_ops import door
from dflash_ops.loopback import free_port

from tests.conftest import REPO_ROOT
from tests.e2e import route_tables

pytestmark = pytest.mark.e2e
CLI = [sys.executable, "-m", "dflash_ops.cli"]
KEY = "sk-one-engine-5be1"
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
BODY = {"model": "tiny", "prompt": "Count on:", "messages": [{"role": "user", "content": "hi"}],
        "input": "hi", "max_tokens": 4}  # fmt: skip


@pytest.fixture(scope="module")
def ports() -> dict[str, int]:
    return {"engine": free_port(), "sidecar": free_port(), "door-base": free_port()}


@pytest.fixture(scope="module")
def door_url(
    tmp_path_factory: pytest.TempPathFactory, models_dir: Path, ports: dict[str, int]
) -> Iterator[str]:
    state_dir = tmp_path_factory.mktemp("door")
    (state_dir / "models").symlink_to(models_dir)
    port = ports["engine"]
    up = [
        *CLI, "local", "up", "--state-dir", str(state_dir), "--method", "off",
        "--enforce-eager", "--no-prometheus", "--engine-port", str(port),
        "--sidecar-port", str(ports["sidecar"]), "--door-base-port", str(ports["door-base"]),
        "--api-key", KEY,
    ]  # fmt: skip
    # One sidecar canary at start, then none for an hour: the probe holds the token counters still.
    quiet = {**os.environ, "DFLASH_SIDECAR_CANARY_INTERVAL": "3600"}
    done = subprocess.run(up, capture_output=True, text=True, timeout=1200, env=quiet)
    try:
        assert done.returncode == 0, done.stderr[-4000:]
        yield f"http://127.0.0.1:{port}"
    finally:
        subprocess.run([*CLI, "local", "down", "--state-dir", str(state_dir)], timeout=300)


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
    open_paths = set(door.door_paths()["open"]["engine"])
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
