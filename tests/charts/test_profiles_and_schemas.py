"""Every profile lints, matches its committed rendering, and passes strict Kubernetes schemas."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from dflash_ops.chart.helm import helm_binary
from dflash_ops.paths import CHART_DIR, EXAMPLES_DIR

from tests.conftest import find_tool

# The oldest and newest Kubernetes versions the chart supports (Chart.yaml kubeVersion >=1.29).
KUBERNETES_VERSIONS = ("1.29.0", "1.37.0")
# Custom resources: no schema in kubernetes-validate; checked by their own tests (the
# RayCluster pod templates as core PodTemplates in test_raycluster.py).
CRD_KINDS = {"PodMonitor", "PrometheusRule", "RayCluster", "ScaledObject"}


@pytest.mark.parametrize("profile", sorted(p.stem for p in (CHART_DIR / "profiles").glob("*.yaml")))
def test_helm_lint_strict(profile: str) -> None:
    result = subprocess.run(
        [
            helm_binary(),
            "lint",
            "--strict",
            str(CHART_DIR),
            "-f",
            str(CHART_DIR / "profiles" / f"{profile}.yaml"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_is_valid_for_kubernetes(version: str, tmp_path: Path) -> None:
    validator = find_tool("kubernetes-validate")
    for example in sorted(EXAMPLES_DIR.glob("*.yaml")):
        docs = [
            d for d in yaml.safe_load_all(example.read_text()) if d and d["kind"] not in CRD_KINDS
        ]
        target = tmp_path / example.name
        target.write_text(yaml.safe_dump_all(docs))
        result = subprocess.run(
            [validator, "--strict", "-k", version, "--quiet", str(target)],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, (
            f"{example.name} @ {version}:\n{result.stdout}{result.stderr}"
        )
