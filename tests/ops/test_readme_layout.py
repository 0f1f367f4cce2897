"""The README's layout section names every package and root module of ops/dflash_ops, so the map
a newcomer reads first does not fall behind the code (it once missed three root modules)."""

from __future__ import annotations

import re

from tests.conftest import REPO_ROOT

OPS = REPO_ROOT / "ops" / "dflash_ops"


def test_the_layout_names_every_package_and_root_module() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout") :]
    layout = layout[: layout.index("\n## ", 1)]
    words = set(re.findall(r"[A-Za-z_]+(?:\.py|/)", layout))
    packages = {f"{p.name}/" for p in OPS.iterdir() if (p / "__init__.py").is_file()}
    modules = {p.name for p in OPS.glob("*.py") if p.name != "__init__.py"}
    missing = sorted((packages | modules) - words)
    assert not missing, f"README's Layout does not name: {', '.join(missing)}"
