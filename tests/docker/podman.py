"""Podman for the image tests: the images ops/setup/images-local.sh builds, run for real.

A pytest plugin (tests/conftest.py loads it) so the e2e suite can start the sidecar image beside
its real engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from importlib.metadata import version

import pytest
from dflash_ops.loopback import free_port

from tests.conftest import REPO_ROOT

TAG = version("dflash-serve")
PYTHON_BASE = "docker.io/library/python:3.11.11-slim-bookworm"
SIDECAR = f"localhost/dflash-serve/sidecar:{TAG}"
ENGINE = f"localhost/dflash-serve/vllm-dflash:0.33.0-dflash-{TAG}"
CPU = f"localhost/dflash-serve/dflash-serve-cpu:{TAG}"
ROUTER_VERSION = next(
    line.split("=", 1)[1].strip()
    for line in (REPO_ROOT / "docker" / "router.Dockerfile").read_text().splitlines()
    if line.startswith("ARG VLLM_ROUTER_VERSION=")
)
ROUTER = f"localhost/dflash-serve/vllm-router:{ROUTER_VERSION}"
CONTAINERS_CONF = REPO_ROOT / ".cache" / "podman" / "containers.conf"


def podman(
    *args: str, check: bool = True, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"CONTAINERS_CONF": str(CONTAINERS_CONF)}
    result = subprocess.run(
        ["podman", *args], capture_output=True, text=True, env=env, timeout=timeout
    )
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {result.stderr[-2000:]}")
    return result


def get(url: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def eventually(check, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except OSError:
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not reached in {timeout:.0f}s"
        time.sleep(0.3)


def ready_or_exited(name: str, url: str, timeout: float, what: str) -> None:
    """Wait for `url` to answer 200; fail at once, with the container's last log lines, if the
    container exits first."""

    def check() -> bool:
        state = json.loads(podman("inspect", "--format", "{{json .State}}", name).stdout)
        if not state["Running"]:
            logs = podman("logs", "--tail", "25", name, check=False)
            raise AssertionError(
                f"{name} exited ({state['ExitCode']}) before {what}:\n{logs.stdout}{logs.stderr}"
            )
        return get(url)[0] == 200

    eventually(check, timeout, what)


def build(*targets: str) -> None:
    for target in targets:
        done = subprocess.run(
            ["bash", str(REPO_ROOT / "ops" / "setup" / "images-local.sh"), target],
            capture_output=True,
            text=True,
            timeout=2400,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


@pytest.fixture(scope="session")
def images() -> None:
    """The images `make test` built (images-local); built here when pytest runs alone."""
    try:
        podman("info", timeout=60)
    except (FileNotFoundError, AssertionError) as err:
        pytest.skip(
            f"podman cannot run here: {err}; `make setup` installs podman, runc, debootstrap"
        )
    missing = [
        i for i in (SIDECAR, ROUTER, ENGINE) if podman("image", "exists", i, check=False).returncode
    ]
    if missing:
        build("all")


@pytest.fixture()
def container(images: None) -> Iterator[list[str]]:
    """Names of containers a test starts; removed afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        podman("rm", "-f", name, check=False)


def run_sidecar(container: list[str], *args: str, engine_url: str | None = None) -> tuple[str, str]:
    name = f"dflash-sidecar-{uuid.uuid4().hex[:8]}"
    port = free_port()
    engine = engine_url or f"http://127.0.0.1:{free_port()}"  # nothing listens: no engine
    podman(
        "run", "-d", "--name", name, "--network=host", SIDECAR, "sidecar",
        "--engine-url", engine, "--port", str(port), "--scrape-interval", "0.5",
        "--scrape-timeout", "0.5", *args,
    )  # fmt: skip
    container.append(name)
    url = f"http://127.0.0.1:{port}"
    ready_or_exited(name, f"{url}/livez", 60, "the sidecar container answering")
    return name, url
