"""Render the chart with the real helm binary and index the manifests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from dflash_ops.chart.helm import helm_template
from dflash_ops.paths import PROFILES_DIR

Manifests = dict[tuple[str, str], dict[str, Any]]


def render(*sets: str, values: list[Path] | None = None, release: str = "t") -> Manifests:
    text = helm_template(values or [], list(sets), release, "llm")
    docs = [d for d in yaml.safe_load_all(text) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def one(manifests: Manifests, kind: str) -> dict[str, Any]:
    found = [m for (k, _), m in manifests.items() if k == kind]
    assert len(found) == 1, f"{len(found)} {kind}s"
    return found[0]


def container(manifests: Manifests, name: str) -> dict[str, Any]:
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == name)


def arg_after(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


@pytest.fixture(scope="module")
def default() -> Manifests:
    return render()


@pytest.fixture(scope="module")
def profile_paths() -> dict[str, Path]:
    return {p.stem: p for p in sorted(PROFILES_DIR.glob("*.yaml"))}
