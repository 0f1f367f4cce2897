"""Fixtures for the patch-series tests: the real vllm==0.33.0 wheel, unpacked."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
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


@pytest.fixture(scope="session")
def run_probe() -> ProbeRunner:
    """Run tests.patches.vllm_probe against a vLLM tree (None: the installed, unpatched one)."""

    def run(tree: Path | None, *args: str) -> dict[str, Any]:
        path = [str(REPO_ROOT)] if tree is None else [str(tree), str(REPO_ROOT)]
        env = os.environ | {"PYTHONPATH": os.pathsep.join(path)}
        result = subprocess.run(
            [sys.executable, "-m", "tests.patches.vllm_probe", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        data: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
        return data

    return run
