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


def test_the_readme_is_a_front_door_whose_links_resolve() -> None:
    """Under 150 lines (what, try it locally, install on a cluster, where next), and every
    relative link in it names a file of the checkout (mkdocs checks only the pages under docs/)."""
    text = (REPO_ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 150
    for heading in ("## Try it locally", "## Install on a cluster", "## Where next"):
        assert f"\n{heading}\n" in text, heading
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    relative = [link for link in links if "://" not in link]
    assert relative, "the README links into the docs"
    missing = [link for link in relative if not (REPO_ROOT / link).exists()]
    assert not missing, f"README links to files that are not there: {missing}"
