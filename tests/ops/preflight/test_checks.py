"""Preflight on recorded API objects (NodeList, CRD, StorageClass, DaemonSet lists) for real
chart renders, and the CLI with no kubeconfig."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dflash_ops.chart.helm import helm_template
from dflash_ops.paths import PROFILES_DIR
from dflash_ops.preflight.checks import Check, check_cluster, report
from dflash_ops.preflight.release_needs import ReleaseNeeds, needs_from_render

from tests.conftest import find_tool

FIXTURES = Path(__file__).parent / "fixtures"


def load(name: str, model: str) -> Any:
    from kubernetes.client import ApiClient

    return ApiClient().deserialize((FIXTURES / name).read_text(), model, "application/json")


class RecordedCluster:
    def __init__(
        self,
        crds: str | None = "crds.json",
        namespaces: set[str] | None = None,
        secrets: dict[str, set[str]] | None = None,
        gpus: int | None = None,
    ) -> None:
        self._nodes = load("nodes.json", "V1NodeList").items
        if gpus is not None:
            for node in self._nodes:
                if node.status.allocatable.get("nvidia.com/gpu"):
                    node.status.allocatable["nvidia.com/gpu"] = str(gpus)
        self._crds: dict[str, dict[str, Any]] = {}
        if crds is not None:
            for item in json.loads((FIXTURES / crds).read_text())["items"]:
                self._crds[item["metadata"]["name"]] = item
            if crds != "crds.json":  # an older KubeRay beside the usual monitoring CRDs
                for item in json.loads((FIXTURES / "crds.json").read_text())["items"]:
                    self._crds.setdefault(item["metadata"]["name"], item)
        self._namespaces = namespaces if namespaces is not None else {"llm"}
        self._secrets = secrets or {}

    def nodes(self) -> list[Any]:
        return list(self._nodes)

    def crd(self, name: str) -> dict[str, Any] | None:
        return self._crds.get(name)

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


def needs(*sets: str, profile: str | None = None) -> ReleaseNeeds:
    files = [PROFILES_DIR / f"{profile}.yaml"] if profile else []
    return needs_from_render(helm_template(files, list(sets), "dflash", "llm"))


def test_fixtures_are_valid_kubernetes_lists(tmp_path: Path) -> None:
    names = ("nodes.json", "storageclasses.json", "daemonsets.json", "crds.json")
    for name in (*names, "crds-kuberay-1.5.json"):
        result = subprocess.run(
            [find_tool("kubernetes-validate"), "-k", "1.31.0", "--quiet", str(FIXTURES / name)],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, name + result.stdout + result.stderr


def test_default_values_pass_on_a_ready_cluster() -> None:
    checks = by_name(check_cluster(needs(), "llm", RecordedCluster()))
    assert all(c.ok for c in checks.values()), [c for c in checks.values() if not c.ok]
    gpu = checks["GPU nodes for Deployment/dflash-dflash-serve"]
    assert "1 pod(s) of 2 nvidia.com/gpu; 2 node(s) match" in gpu.detail
    assert "gpu-operator/nvidia-device-plugin-daemonset" in checks["NVIDIA device plugin"].detail
    assert checks["Model cache storage"].detail.endswith("default StorageClass: gp3")


def test_h100_profile_finds_one_node() -> None:
    checks = by_name(check_cluster(needs(profile="h100-tp2-dflash2"), "llm", RecordedCluster()))
    gpu = checks["GPU nodes for Deployment/dflash-dflash-serve"]
    assert gpu.ok and "1 node(s) match" in gpu.detail


def test_the_pods_affinity_decides_where_they_fit() -> None:
    """gpu.type=h100 alone targets the H100 node; replicas beyond its 8 GPUs do not fit."""
    checks = by_name(
        check_cluster(
            needs("gpu.type=h100", "replicas=5", "modelCache.accessModes={ReadWriteMany}"),
            "llm",
            RecordedCluster(),
        )
    )
    gpu = checks["GPU nodes for Deployment/dflash-dflash-serve"]
    assert not gpu.ok and "1 node(s) match" in gpu.detail and "room for 4" in gpu.detail
    # Without the product affinity every node with GPUs counts.
    off = by_name(check_cluster(needs("gpu.productAffinity=false"), "llm", RecordedCluster()))
    assert (
        "4 node(s) match (any node), 3 of them with 2 allocatable"
        in off["GPU nodes for Deployment/dflash-dflash-serve"].detail
    )


def test_an_untolerated_taint_keeps_the_pods_off_a_node() -> None:
    from kubernetes.client import V1NodeSpec, V1Taint

    cluster = RecordedCluster()
    for node in cluster._nodes:
        if node.metadata.name != "gpu-a100-0":
            continue
        node.spec = node.spec or V1NodeSpec()
        node.spec.taints = [V1Taint(key="dedicated", value="training", effect="NoSchedule")]
    checks = by_name(check_cluster(needs(), "llm", cluster))
    assert "1 node(s) match" in checks["GPU nodes for Deployment/dflash-dflash-serve"].detail


def test_missing_pieces_each_get_a_fix() -> None:
    release = needs(
        "model.hfTokenSecret.name=hf",
        "modelCache.storageClass=premium-rwx",
        profile="a100-2node-tp4-ray",
    )
    cluster = RecordedCluster(crds=None, namespaces=set(), gpus=1)
    checks = by_name(check_cluster(release, "llm", cluster))
    head = checks["GPU nodes for RayCluster/dflash-dflash-serve head"]
    assert not head.ok and "1 pod(s) of 2 nvidia.com/gpu" in head.detail
    ray = checks["CRD rayclusters.ray.io"]
    assert not ray.ok and "KubeRay" in ray.fix
    assert not checks["CRD podmonitors.monitoring.coreos.com"].ok
    storage = checks["Model cache storage"]
    assert not storage.ok and "premium-rwx" in storage.fix
    assert not checks["Namespace"].ok and "create namespace llm" in checks["Namespace"].fix
    secret = checks["Secret hf"]
    assert not secret.ok and "create secret generic hf --from-literal=token=" in secret.fix


def test_the_api_key_secret_and_its_key_are_checked() -> None:
    release = needs("auth.apiKeySecret.name=vllm-key")
    right = RecordedCluster(secrets={"llm/vllm-key": {"api-key"}})
    assert by_name(check_cluster(release, "llm", right))["Secret vllm-key"].ok
    wrong = by_name(
        check_cluster(release, "llm", RecordedCluster(secrets={"llm/vllm-key": {"token"}}))
    )
    secret = wrong["Secret vllm-key"]
    assert not secret.ok and "key api-key" in secret.detail and "['token']" in secret.detail


def test_an_old_kuberay_is_caught() -> None:
    release = needs(profile="a100-2node-tp4-ray")
    current = by_name(check_cluster(release, "llm", RecordedCluster()))
    assert current["KubeRay upgrades"].ok
    old = by_name(check_cluster(release, "llm", RecordedCluster(crds="crds-kuberay-1.5.json")))
    check = old["KubeRay upgrades"]
    assert not check.ok and "1.6" in check.fix
    assert current["KubeRay Ray authentication"].ok
    auth = old["KubeRay Ray authentication"]
    assert not auth.ok and "authOptions" in auth.detail and "1.6" in auth.fix


def test_preflight_and_render_take_the_same_value_arguments() -> None:
    from dflash_ops.cli import build_parser

    words = ["--profile", "h100-tp2-dflash2", "-f", "x.yaml", "--set", "replicas=2"]
    parser = build_parser()
    render, preflight = (
        parser.parse_args(["render", *words]),
        parser.parse_args(["preflight", *words]),
    )
    for name in ("profile", "values", "sets"):
        assert getattr(render, name) == getattr(preflight, name)


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
