from __future__ import annotations

import pytest
from dflash_ops.errors import UserError

from tests.charts.conftest import Manifests, one, render

RWX = "modelCache.accessModes={ReadWriteMany}"


def test_service_exposes_the_api_only_unless_asked(default: Manifests) -> None:
    ports = {p["name"]: p for p in default[("Service", "t-dflash-serve")]["spec"]["ports"]}
    assert set(ports) == {"http"} and ports["http"]["port"] == 8000
    exposed = render("service.exposeSidecar=true", "service.type=LoadBalancer")
    service = exposed[("Service", "t-dflash-serve")]["spec"]
    assert service["type"] == "LoadBalancer"
    assert {p["name"]: p["port"] for p in service["ports"]} == {"http": 8000, "sidecar": 9100}


def test_pdb(default: Manifests) -> None:
    assert one(default, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize("value", ["0", "0%"])
def test_a_pdb_that_blocks_every_drain_is_refused(value: str) -> None:
    with pytest.raises(UserError, match="blocks every node drain forever"):
        render(f"podDisruptionBudget.maxUnavailable={value}")


def test_ray_layout_lets_head_workers_and_the_operator_talk() -> None:
    manifests = render("networkPolicy.enabled=true", "distributed.enabled=true", RWX)
    policies = {name: m for (k, name), m in manifests.items() if k == "NetworkPolicy"}
    ray = policies["t-dflash-serve-ray"]
    # Every pod of the release (head and workers), not only the engine pods.
    assert ray["spec"]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "dflash-serve",
        "app.kubernetes.io/instance": "t",
    }
    peers, operator = ray["spec"]["ingress"]
    assert "ports" not in peers  # all of Ray's ports between its own nodes
    # The head listens for the operator on GCS only: no dashboard, no Jobs API, no client port.
    assert {p["port"] for p in operator["ports"]} == {6379}
    assert operator["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "ray-system"
    }


def test_networkpolicy_is_optional_and_opens_only_the_api_and_metrics(default: Manifests) -> None:
    assert not [k for k in default if k[0] == "NetworkPolicy"]
    policy = one(render("networkPolicy.enabled=true"), "NetworkPolicy")
    ingress = policy["spec"]["ingress"]
    assert [p["port"] for p in ingress[0]["ports"]] == ["http"]
    assert {p["port"] for p in ingress[1]["ports"]} == {"http", "sidecar"}
