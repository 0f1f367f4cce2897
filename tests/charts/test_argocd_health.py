"""The Argo CD health check shipped for the Ray layout (files/argocd/raycluster-health.lua), run
the way Argo CD runs it: a Lua 5.1 chunk (Argo CD embeds gopher-lua, a Lua 5.1 implementation)
with the object in the global `obj`, returning {status, message}. The objects are the chart's
own rendered RayCluster with the status KubeRay v1.7 writes."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from dflash_ops.paths import CHART_FILES_DIR, REPO_ROOT

from tests.charts.conftest import one, render

lupa = pytest.importorskip("lupa.lua51", reason="lupa (a dev dependency) provides Lua 5.1")

SCRIPT = (CHART_FILES_DIR / "argocd" / "raycluster-health.lua").read_text()


def health(obj: dict[str, Any]) -> tuple[str, str]:
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(SCRIPT)
    return str(result["status"]), str(result["message"])


@pytest.fixture(scope="module")
def rendered() -> dict[str, Any]:
    manifests = render("distributed.enabled=true", "modelCache.accessModes={ReadWriteMany}")
    cluster = one(manifests, "RayCluster")
    cluster["metadata"]["generation"] = 3
    return cluster


def condition(kind: str, status: str, message: str = "") -> dict[str, str]:
    return {"type": kind, "status": status, "reason": "Test", "message": message}


def with_status(cluster: dict[str, Any], **status: Any) -> dict[str, Any]:
    obj = copy.deepcopy(cluster)
    obj["status"] = {"observedGeneration": 3, **status}
    return obj


def serving(cluster: dict[str, Any]) -> dict[str, Any]:
    workers = sum(g["replicas"] for g in cluster["spec"]["workerGroupSpecs"])
    return with_status(
        cluster,
        state="ready",
        desiredWorkerReplicas=workers,
        readyWorkerReplicas=workers,
        conditions=[
            condition("RayClusterProvisioned", "True"),
            condition("HeadPodReady", "True"),
        ],
    )


def test_a_serving_cluster_is_healthy(rendered: dict[str, Any]) -> None:
    status, message = health(serving(rendered))
    assert status == "Healthy", message
    assert "workers ready" in message


def test_no_status_yet_is_progressing_not_healthy(rendered: dict[str, Any]) -> None:
    assert health(rendered)[0] == "Progressing"


def test_a_status_for_an_older_generation_is_progressing(rendered: dict[str, Any]) -> None:
    obj = serving(rendered)
    obj["status"]["observedGeneration"] = 2  # an upgrade KubeRay has not acted on yet
    status, message = health(obj)
    assert status == "Progressing" and "generation 3" in message


def test_a_head_that_is_not_ready_says_why(rendered: dict[str, Any]) -> None:
    obj = serving(rendered)
    obj["status"]["conditions"][1] = condition("HeadPodReady", "False", "containers not ready")
    status, message = health(obj)
    assert status == "Progressing" and "containers not ready" in message


def test_missing_workers_keep_it_progressing(rendered: dict[str, Any]) -> None:
    obj = serving(rendered)
    obj["status"]["readyWorkerReplicas"] = obj["status"]["desiredWorkerReplicas"] - 1
    assert health(obj)[0] == "Progressing"


def test_a_replica_failure_is_degraded_with_kuberays_message(rendered: dict[str, Any]) -> None:
    obj = serving(rendered)
    obj["status"]["conditions"].append(
        condition("ReplicaFailure", "True", 'pods "w-0" is forbidden: exceeded quota')
    )
    status, message = health(obj)
    assert status == "Degraded" and "exceeded quota" in message


def test_suspension(rendered: dict[str, Any]) -> None:
    obj = serving(rendered)
    obj["status"]["conditions"].append(condition("RayClusterSuspending", "True"))
    assert health(obj)[0] == "Progressing"
    obj["status"]["conditions"][-1] = condition("RayClusterSuspended", "True")
    assert health(obj)[0] == "Suspended"


def test_the_docs_install_it_under_argo_cds_key() -> None:
    readme = (REPO_ROOT / "docs" / "day2.md").read_text()
    assert "resource.customizations.health.ray.io_RayCluster" in readme
    assert "files/argocd/raycluster-health.lua" in readme
