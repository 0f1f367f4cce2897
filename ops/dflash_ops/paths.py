"""Where the project's files are: every path the code reads is named here, once."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
README = REPO_ROOT / "README.md"
TOOLS_BIN = REPO_ROOT / ".cache" / "bin"

CHART_DIR = REPO_ROOT / "charts" / "dflash-serve"
CHART_FILES_DIR = CHART_DIR / "files"
PROFILES_DIR = CHART_DIR / "profiles"
EXAMPLES_DIR = CHART_DIR / "examples"

OPS_DIR = REPO_ROOT / "ops"
RULES_DIR = OPS_DIR / "prometheus" / "rules"
DASHBOARDS_DIR = OPS_DIR / "grafana" / "dashboards"
