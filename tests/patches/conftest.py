"""Fixtures for the patch-series tests: the real vllm==0.33.0 wheel, unpacked."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dflash_patches import series

from tests.conftest import REPO_ROOT

WHEEL_DIR = REPO_ROOT / ".cache" / "wheels"


@pytest.fixture(scope="session")
def manifest() -> series.Manifest:
    return series.load_manifest()


@pytest.fixture(scope="session")
def vllm_wheel(manifest: series.Manifest) -> Path:
    wheel = WHEEL_DIR / manifest.wheel
    if not wheel.is_file():
        pytest.fail(f"{wheel} is missing: `make setup` fetches vllm==0.33.0 (ops/setup/setup.sh)")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert digest == manifest.wheel_sha256, "the cached vLLM wheel is not the pinned 0.33.0 wheel"
    return wheel


@pytest.fixture(scope="session")
def wheel_sources(vllm_wheel: Path, manifest: series.Manifest) -> dict[str, bytes]:
    """Original bytes of every patch target and the dist-info, read from the wheel."""
    targets = {t for p in manifest.patches for t in p.targets}
    with zipfile.ZipFile(vllm_wheel) as wheel:
        names = [n for n in wheel.namelist() if n in targets or ".dist-info/" in n]
        return {name: wheel.read(name) for name in names}


@pytest.fixture()
def target_tree(tmp_path: Path, wheel_sources: dict[str, bytes]) -> Path:
    """A site-packages holding the original target files and vLLM's dist-info."""
    for name, data in wheel_sources.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return tmp_path


@pytest.fixture(scope="session")
def patched_vllm(tmp_path_factory: pytest.TempPathFactory, vllm_wheel: Path) -> Path:
    """The whole 0.33.0 wheel unpacked with the series applied by the project's own tool."""
    root = tmp_path_factory.mktemp("patched-vllm")
    with zipfile.ZipFile(vllm_wheel) as wheel:
        wheel.extractall(root)
    series.apply(root)
    return root


ProbeRunner = Callable[..., dict[str, Any]]


class ProbeServer:
    """`python -m tests.patches.vllm_probe serve` against one vLLM tree: vLLM imported once,
    each probe answered in a forked child."""

    def __init__(self, tree: Path | None, log: Path) -> None:
        path = [str(REPO_ROOT)] if tree is None else [str(tree), str(REPO_ROOT)]
        self.log = log
        self.log_file = log.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.patches.vllm_probe", "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log_file,
            text=True,
            env=os.environ | {"PYTHONPATH": os.pathsep.join(path)},
        )

    def run(self, *args: str) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(list(args)) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, f"the probe server died: {self.log.read_text()[-3000:]}"
        reply = json.loads(line)
        assert reply["returncode"] == 0, (args, reply["stderr"][-3000:])
        data: dict[str, Any] = json.loads(reply["stdout"].strip().splitlines()[-1])
        return data

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log_file.close()


@pytest.fixture(scope="session")
def run_probe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProbeRunner]:
    """Run tests.patches.vllm_probe against a vLLM tree (None: the installed, unpatched one)."""
    servers: dict[Path | None, ProbeServer] = {}
    logs = tmp_path_factory.mktemp("probe-servers")

    def run(tree: Path | None, *args: str) -> dict[str, Any]:
        if tree not in servers:
            servers[tree] = ProbeServer(tree, logs / f"server-{len(servers)}.log")
        return servers[tree].run(*args)

    yield run
    for server in servers.values():
        server.close()
