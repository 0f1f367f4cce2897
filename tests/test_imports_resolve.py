"""Every import of project code in the tests names a module that exists, the ones inside a
function body included: those run only when their test gets there, and an e2e test that imports
a moved helper after minutes of work fails only in CI (the Ray head e2e did, after a move)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from tests.conftest import REPO_ROOT

ROOTS = ("tests", "dflash_ops", "dflash_sidecar", "dflash_patches")


def project_imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [(node.lineno, name) for name in names if name.split(".")[0] in ROOTS]
    return found


def test_every_project_import_in_the_tests_resolves() -> None:
    missing = [
        f"{path.relative_to(REPO_ROOT)}:{line}: {name}"
        for path in sorted((REPO_ROOT / "tests").rglob("*.py"))
        for line, name in project_imports(path)
        if importlib.util.find_spec(name) is None
    ]
    assert not missing, "imports of modules that do not exist:\n" + "\n".join(missing)
