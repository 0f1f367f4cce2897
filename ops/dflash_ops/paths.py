"""Where the project's files are: every path the code reads is named here, once.

From a checkout (or an editable install) they are the repository's own files; installed from a
wheel, the copies the build bundles in dflash_ops/assets (setup.py). Paths that only exist in a
checkout (the docs, the tools `make setup` fetches) say so where they are used.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
ASSETS = PACKAGE_DIR / "assets"
INSTALLED = ASSETS.is_dir()

REPO_ROOT = PACKAGE_DIR.parents[1]
PLANNING_DOC = REPO_ROOT / "docs" / "planning.md"
TOOLS_BIN = REPO_ROOT / ".cache" / "bin"

CHART_DIR = ASSETS / "chart" if INSTALLED else REPO_ROOT / "charts" / "dflash-serve"
CHART_FILES_DIR = CHART_DIR / "files"
PROFILES_DIR = CHART_DIR / "profiles"
EXAMPLES_DIR = CHART_DIR / "examples"

OPS_DIR = ASSETS if INSTALLED else REPO_ROOT / "ops"
RULES_DIR = OPS_DIR / "prometheus" / "rules"
DASHBOARDS_DIR = OPS_DIR / "grafana" / "dashboards"
