"""Preflight on recorded API objects (NodeList, CRD, StorageClass, DaemonSet lists), and the
CLI with no kubeconfig."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dflash_ops.chart.values import chart_values
from dflash_ops.paths import PROFILES_DIR
from dflash_ops.preflight.checks import Check, check_cluster, report

from tests.conftest import find_tool

FIXTURES = Path(__file__).parent / "fixtures"


def load(name: str, model: str) -> Any:
    from kubernetes.client import ApiClient

    return ApiClient().deserialize((FIXTURES / name).read_text(), model, "application/json")


class RecordedCluster:
    def __init__(
        self,
        crds: set[str] | None = None,
        namespaces: set[str] | None = None,
        secrets: dict[str, set[str]] | None = None,
        gpus: int | None = None,
    ) -> None:
        self._nodes = load("nodes.json", "V1NodeList").items
        if gpus is not None:
            for node in self._nodes:
                if node.status.allocatable.get("nvidia.com/gpu"):
                    node.status.allocatable["nvidia.com/gpu"] = str(gpus)
        self._crds = (
            crds
            if crds is not None
            else {
                c.metadata.name for c in load("crds.json", "V1CustomResourceDefinitionList").items
            }
        )
        self._namespaces = namespaces if namespaces is not None else {"llm"}
        self._secrets = secrets or {}

    def nodes(self) -> list[Any]:
        return list(self._nodes)

    def crd_names(self) -> set[str]:
        return self._crds

    def storage_classes(self) -> list[Any]:
        return list(load("storageclasses.json", "V1StorageClassList").items)

    def daemonsets(self) -> list[Any]:
        return list(load("daemonsets.json", "V1DaemonSetList").items)

    def namespace_exists(self, name: str) -> bool:
        return name in self._namespaces

    def secret_keys(self, namespace: str, name: str) -> set[str] | None:
        return self._secrets.get(f"{namespace}/{name}")


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def test_fixtures_are_valid_kubernetes_lists(tmp_path: Path) -> None:
    for name in ("nodes.json", "storageclasses.json", "daemonsets.json", "crds.json"):
        result = subprocess.run(
            [find_tool("kubernetes-validate"), "-k", "1.31.0", "--quiet", str(FIXTURES / name)],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, name + result.stdout + result.stderr


def test_default_values_pass_on_a_ready_cluster() -> None:
    checks = by_name(check_cluster(chart_values([]), "llm", RecordedCluster()))
    assert all(c.ok for c in checks.values()), [c for c in checks.values() if not c.ok]
    assert "room for 8 pod(s), the release needs 1" in checks["GPU nodes"].detail
    assert "gpu-operator/nvidia-device-plugin-daemonset" in checks["NVIDIA device plugin"].detail
    assert checks["Model cache storage"].detail == "default StorageClass: gp3"


def test_h100_profile_finds_one_node() -> None:
    values = chart_values([PROFILES_DIR / "h100-tp2-dflash2.yaml"])
    checks = by_name(check_cluster(values, "llm", RecordedCluster()))
    assert "1 node(s) labelled" in checks["GPU nodes"].detail and checks["GPU nodes"].ok


def test_missing_pieces_each_get_a_fix() -> None:
    values = chart_values([PROFILES_DIR / "a100-2node-tp4-ray.yaml"])
    values["model"]["hfTokenSecret"]["name"] = "hf"
    values["modelCache"]["storageClass"] = "premium-rwx"
    cluster = RecordedCluster(crds=set(), namespaces=set(), gpus=1)
    checks = by_name(check_cluster(values, "llm", cluster))
    assert not checks["GPU nodes"].ok and "needs 2" in checks["GPU nodes"].detail
    assert (
        not checks["CRD rayclusters.ray.io"].ok
        and "KubeRay" in checks["CRD rayclusters.ray.io"].fix
    )
    assert not checks["CRD podmonitors.monitoring.coreos.com"].ok
    assert (
        not checks["Model cache storage"].ok and "premium-rwx" in checks["Model cache storage"].fix
    )
    assert not checks["Namespace"].ok and "create namespace llm" in checks["Namespace"].fix
    assert (
        not checks["HF token Secret"].ok
        and "create secret generic hf" in checks["HF token Secret"].fix
    )


def test_report_formats_and_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    checks = [
        Check(name="a", ok=True, detail="fine"),
        Check(name="b", ok=False, detail="bad", fix="do x"),
    ]
    assert report(checks, "text") == 1
    out = capsys.readouterr().out
    assert "[FAIL] b: bad" in out and "fix: do x" in out
    assert report(checks[:1], "json") == 0
    assert json.loads(capsys.readouterr().out)[0]["name"] == "a"


def test_cli_without_kubeconfig_fails_clearly(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env |= {"KUBECONFIG": str(tmp_path / "missing"), "HOME": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "dflash_ops.cli", "preflight"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 2
    assert "no usable kubeconfig" in result.stderr and "Traceback" not in result.stderr
