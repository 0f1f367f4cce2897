"""dflash-serve installed from its wheel into a clean virtualenv (not editable, no checkout on
the path): the chart, its profiles, the patch series, rules and dashboards come with it, and a
command that needs more than the wheel says so in one line."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, TOOLS_BIN

pytestmark = pytest.mark.e2e  # builds a wheel and a virtualenv: about a minute


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The bin/ directory of a fresh virtualenv with the built wheel installed."""
    root = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(root), str(REPO_ROOT)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = root.glob("dflash_serve-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True)
    bin_dir = root / "venv" / "bin"
    subprocess.run(
        [str(bin_dir / "pip"), "install", "-q", "--disable-pip-version-check", str(wheel)],
        check=True, capture_output=True,
    )  # fmt: skip
    yield bin_dir


def run(bin_dir: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{TOOLS_BIN}{os.pathsep}{env['PATH']}"
    return subprocess.run(
        [str(bin_dir / "dflash-serve"), *argv],
        capture_output=True, text=True, cwd=cwd, env=env, timeout=300,
    )  # fmt: skip


def test_render_offers_and_renders_the_profiles(installed: Path, tmp_path: Path) -> None:
    help_text = run(installed, "render", "--help", cwd=tmp_path).stdout
    assert "a100-tp2-dflash2" in help_text and "a100-tp2-mtp3" in help_text
    done = run(installed, "render", "--profile", "a100-tp2-dflash2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "kind: PrometheusRule" in done.stdout and "speculative-decoding.json" in done.stdout
    assert '- "1680"' in done.stdout  # the block size from the bundled table


def test_plan_from_the_bundled_config(installed: Path, tmp_path: Path) -> None:
    done = run(installed, "plan", "--gpu", "a100", "--tp", "2", "--k", "7", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "--block-size 1680" in done.stdout


def test_patches_check_finds_the_bundled_series(installed: Path, tmp_path: Path) -> None:
    from dflash_patches import series

    manifest = series.load_manifest()
    wheel = REPO_ROOT / ".cache" / "wheels" / manifest.wheel
    targets = {t for p in manifest.patches for t in p.targets}
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name in targets or ".dist-info/" in name:
                archive.extract(name, tmp_path)
    done = run(installed, "patches", "check", "--site-packages", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(": pending") == len(manifest.patches)


def test_sidecar_help(installed: Path, tmp_path: Path) -> None:
    done = run(installed, "sidecar", "--help", cwd=tmp_path)
    assert done.returncode == 0 and "DFLASH_SIDECAR_SCRAPE_INTERVAL" in done.stdout


def test_local_up_names_what_it_needs_in_one_line(
    installed: Path, tmp_path: Path, strangers_on_default_ports: list[ThreadingHTTPServer]
) -> None:
    # On the default ports, where the session's strangers listen (tests/conftest.py): what the
    # machine lacks is named first, not a busy port.
    done = run(installed, "local", "up", "--state-dir", str(tmp_path / "stack"), cwd=tmp_path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "runs a real vLLM CPU engine" in line and "vllm" in line
