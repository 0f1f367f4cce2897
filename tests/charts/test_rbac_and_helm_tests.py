from __future__ import annotations

from tests.charts.conftest import Manifests, container, one, render


def test_events_rbac_only_when_enabled_and_only_create_events(default: Manifests) -> None:
    assert not [k for k in default if k[0] in ("Role", "RoleBinding")]
    manifests = render("sidecar.kubernetesEvents=true")
    role = one(manifests, "Role")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    env = {e["name"] for e in container(manifests, "sidecar")["env"]}
    assert {"DFLASH_SIDECAR_POD_NAME", "DFLASH_SIDECAR_POD_NAMESPACE"} <= env


def test_helm_test_hooks(default: Manifests) -> None:
    pods = [m for (k, _), m in default.items() if k == "Pod"]
    checks = sorted(p["spec"]["containers"][0]["args"][0] for p in pods)
    assert checks == ["chat", "spec-metrics", "tool-call"]
    for pod in pods:
        annotations = pod["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "test"
        # Deleted once passed, kept (for its logs) while failing, replaced on the next run.
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    spec = next(p for p in pods if p["spec"]["containers"][0]["args"][0] == "spec-metrics")
    args = spec["spec"]["containers"][0]["args"]
    assert args[args.index("--pods-dns") + 1] == "t-dflash-serve-pods.llm.svc"
    headless = default[("Service", "t-dflash-serve-pods")]
    assert headless["spec"]["clusterIP"] == "None"
    assert (
        headless["spec"]["selector"]
        == one(default, "Deployment")["spec"]["selector"]["matchLabels"]
    )
    off = [m for (k, _), m in render("speculative.method=off").items() if k == "Pod"]
    assert sorted(p["spec"]["containers"][0]["args"][0] for p in off) == ["chat", "tool-call"]
