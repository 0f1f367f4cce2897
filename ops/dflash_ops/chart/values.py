"""The chart's values as helm merges them, and the values files a command is given."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from dflash_ops.files import read_yaml
from dflash_ops.paths import CHART_DIR, PROFILES_DIR


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def chart_values(files: list[Path]) -> dict[str, Any]:
    """The chart's values.yaml with these values files merged over it, as helm merges them."""
    values: dict[str, Any] = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    for path in files:
        values = deep_merge(values, read_yaml(path, "values file", dict, empty={}))
    return values


def profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def add_values_arguments(parser: argparse.ArgumentParser) -> None:
    """--profile, -f/--values and --set, as `render` and `preflight` take them (helm's order:
    the profile, then each -f file, then each --set)."""
    parser.add_argument("--profile", choices=profiles(), help="a values profile from the chart")
    parser.add_argument(
        "-f", "--values", type=Path, action="append", default=[], help="a values file (repeatable)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        dest="sets",
        metavar="KEY=VALUE",
        help="a value, as helm --set takes it (repeatable)",
    )


def values_files(args: argparse.Namespace) -> list[Path]:
    """The profile and -f files, each checked to be a YAML mapping (helm's own message for a
    bad file is a Go error far from the file's name)."""
    files: list[Path] = [PROFILES_DIR / f"{args.profile}.yaml"] if args.profile else []
    files += args.values
    for path in files:
        read_yaml(path, "values file", dict, empty={})
    return files
