"""`dflash-serve render`: show exactly what the chart would deploy (real `helm template`)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from dflash_ops.errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "charts" / "dflash-serve"
PROFILES_DIR = CHART_DIR / "profiles"
EXAMPLES_DIR = CHART_DIR / "examples"
EXAMPLE_RELEASE = "dflash"
EXAMPLE_NAMESPACE = "llm"


def helm_binary() -> str:
    local = REPO_ROOT / ".cache" / "bin" / "helm"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which("helm")
    if found is None:
        raise UserError(
            "helm is not installed: run `make setup` (helm v4 in .cache/bin) or install it"
        )
    return found


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
        values = deep_merge(values, yaml.safe_load(path.read_text()) or {})
    return values


def profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def helm_template(
    values_files: list[Path], sets: list[str], release: str, namespace: str, chart: Path = CHART_DIR
) -> str:
    cmd = [helm_binary(), "template", release, str(chart), "--namespace", namespace]
    for path in values_files:
        cmd += ["-f", str(path)]
    for item in sets:
        cmd += ["--set", item]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        errors = [
            line
            for line in result.stderr.splitlines()
            if "symbolic link" not in line and line.strip()
        ]
        raise UserError("the chart refused these values:\n  " + "\n  ".join(errors))
    return result.stdout


def render_examples(out: Path = EXAMPLES_DIR) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in profiles():
        text = helm_template(
            [PROFILES_DIR / f"{name}.yaml"], [], EXAMPLE_RELEASE, EXAMPLE_NAMESPACE
        )
        path = out / f"{name}.yaml"
        path.write_text(text)
        written.append(path)
    return written


def add_values_arguments(parser: argparse.ArgumentParser) -> None:
    """--profile and -f/--values, as `render` and `preflight` take them."""
    parser.add_argument("--profile", choices=profiles(), help="a values profile from the chart")
    parser.add_argument("-f", "--values", type=Path, action="append", default=[])


def values_files(args: argparse.Namespace) -> list[Path]:
    files: list[Path] = [PROFILES_DIR / f"{args.profile}.yaml"] if args.profile else []
    files += args.values
    for path in files:
        if not path.is_file():
            raise UserError(f"values file {path} not found")
    return files


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "render",
        help="render the Helm chart's manifests for a profile or values files",
        description=(
            "Run the real `helm template` on charts/dflash-serve and print the manifests: what "
            "`helm install` would create, including the block size the chart picked."
        ),
    )
    add_values_arguments(parser)
    parser.add_argument("--set", action="append", default=[], dest="sets", help="key=value")
    parser.add_argument("--release", default=EXAMPLE_RELEASE)
    parser.add_argument("--namespace", default=EXAMPLE_NAMESPACE)
    parser.add_argument(
        "--write-examples",
        action="store_true",
        help="rewrite charts/dflash-serve/examples/<profile>.yaml for every profile",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.write_examples:
        for path in render_examples():
            print(f"wrote {path}", file=sys.stderr)
        return 0
    sys.stdout.write(helm_template(values_files(args), args.sets, args.release, args.namespace))
    return 0
