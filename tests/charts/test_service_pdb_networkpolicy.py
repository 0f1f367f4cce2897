from __future__ import annotations

from tests.charts.conftest import Manifests, one, render


def test_service_exposes_api_and_sidecar(default: Manifests) -> None:
    ports = {p["name"]: p for p in one(default, "Service")["spec"]["ports"]}
    assert ports["http"]["port"] == 8000 and ports["sidecar"]["port"] == 9100


def test_pdb(default: Manifests) -> None:
    assert one(default, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1


def test_networkpolicy_is_optional_and_opens_only_the_api_and_metrics(default: Manifests) -> None:
    assert not [k for k in default if k[0] == "NetworkPolicy"]
    policy = one(render("networkPolicy.enabled=true"), "NetworkPolicy")
    ingress = policy["spec"]["ingress"]
    assert [p["port"] for p in ingress[0]["ports"]] == ["http"]
    assert {p["port"] for p in ingress[1]["ports"]} == {"http", "sidecar"}
