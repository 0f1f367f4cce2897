"""The route tables' cache (tests/e2e/route_tables.py): built once per vLLM install, built again
when a file of the vllm package changes. A stand-in environment whose `python` counts its runs
stands for the real one (building the real tables is the e2e door tests' part)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.e2e import route_tables

TABLE = {"/v1/completions": ["POST"], "/health": ["GET"]}


def environment(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A venv with a vllm package and a `python` that records each run and prints TABLE."""
    venv = tmp_path / "venv"
    package = venv / "lib" / "python3.11" / "site-packages" / "vllm"
    (package / "entrypoints").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "entrypoints" / "app.py").write_text("routes = 1\n")
    runs = tmp_path / "runs"
    python = venv / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f"#!/bin/sh\necho run >> {runs}\necho '{json.dumps(TABLE)}'\n")
    python.chmod(0o755)
    return python, package, runs


def runs_of(runs: Path) -> int:
    return len(runs.read_text().splitlines()) if runs.exists() else 0


def test_the_tables_are_built_once_per_install_and_again_when_vllm_changes(tmp_path: Path) -> None:
    python, package, runs = environment(tmp_path)
    cache = tmp_path / "cache"
    routes = route_tables.vllm_routes.__wrapped__  # past the in-process cache
    assert routes(python, cache) == TABLE and runs_of(runs) == 1
    assert routes(python, cache) == TABLE and runs_of(runs) == 1  # from the cache
    app = package / "entrypoints" / "app.py"
    app.write_text("routes = 22\n")  # another size: another install
    assert routes(python, cache) == TABLE and runs_of(runs) == 2
    stat = app.stat()
    os.utime(app, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))  # same size, touched
    assert routes(python, cache) == TABLE and runs_of(runs) == 3
    assert routes(python, cache) == TABLE and runs_of(runs) == 3
    assert [p.suffix for p in cache.iterdir()] == [".json"] * 3  # no partial file left


def test_without_a_vllm_package_nothing_is_kept(tmp_path: Path) -> None:
    python, package, runs = environment(tmp_path)
    (package / "__init__.py").unlink()
    (package / "entrypoints" / "app.py").unlink()
    (package / "entrypoints").rmdir()
    package.rmdir()
    cache = tmp_path / "cache"
    assert route_tables.cache_key(python) is None
    routes = route_tables.vllm_routes.__wrapped__
    assert routes(python, cache) == TABLE and routes(python, cache) == TABLE
    assert runs_of(runs) == 2 and not cache.exists()
