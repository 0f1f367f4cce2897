"""The docs site: `mkdocs build --strict` passes (a link to a missing page or anchor fails it),
and its code map names every package and root module of ops/dflash_ops, so the map a newcomer
reads first does not fall behind the code (it once missed three root modules)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT

OPS = REPO_ROOT / "ops" / "dflash_ops"
QUIET = os.environ | {"NO_MKDOCS_2_WARNING": "1"}


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"),
         "-d", str(site)],
        capture_output=True, text=True, timeout=300, env=QUIET,
    )  # fmt: skip


def test_the_site_builds_strict(tmp_path: Path) -> None:
    done = build(REPO_ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "code-map" / "index.html").is_file()


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    copy.mkdir()
    shutil.copy(REPO_ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    shutil.copytree(REPO_ROOT / "docs", copy / "docs")
    index = copy / "docs" / "index.md"
    index.write_text(index.read_text() + "\nSee [a page that is gone](gone.md).\n")
    done = build(copy, tmp_path / "site")
    assert done.returncode != 0 and "gone.md" in done.stderr, done.stderr[-2000:]


def test_the_code_map_names_every_package_and_root_module() -> None:
    page = (REPO_ROOT / "docs" / "code-map.md").read_text()
    layout = page[page.index("## Layout") :]
    layout = layout[: layout.index("\n## ", 1)]
    words = set(re.findall(r"[A-Za-z_]+(?:\.py|/)", layout))
    packages = {f"{p.name}/" for p in OPS.iterdir() if (p / "__init__.py").is_file()}
    modules = {p.name for p in OPS.glob("*.py") if p.name != "__init__.py"}
    missing = sorted((packages | modules) - words)
    assert not missing, f"docs/code-map.md's Layout does not name: {', '.join(missing)}"
