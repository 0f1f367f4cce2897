from __future__ import annotations

import pytest
from dflash_ops.errors import UserError

from tests.charts.conftest import one, render

SHARED_CACHE = "modelCache.accessModes={ReadWriteMany}"


def test_keda_scales_on_waiting_requests() -> None:
    manifests = render("autoscaling.enabled=true", SHARED_CACHE)
    scaled = one(manifests, "ScaledObject")
    trigger = scaled["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus"
    assert (
        trigger["metadata"]["query"]
        == 'sum(vllm:num_requests_waiting{namespace="llm", release="t"})'
    )
    assert scaled["spec"]["scaleTargetRef"]["name"] == "t-dflash-serve"
    # The autoscaler owns the replica count: an upgrade must not reset it.
    assert "replicas" not in one(manifests, "Deployment")["spec"]
    assert one(render(), "Deployment")["spec"]["replicas"] == 1


def test_hpa_alternative_keeps_the_gpu_safe_rollout() -> None:
    manifests = render(
        "autoscaling.enabled=true",
        "autoscaling.engine=hpa",
        "rollout.strategy=RollingUpdate",
        SHARED_CACHE,
    )
    hpa = one(manifests, "HorizontalPodAutoscaler")
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "vllm_num_requests_waiting"
    assert one(manifests, "Deployment")["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0


@pytest.mark.parametrize("sets", [["autoscaling.enabled=true"], ["replicas=2"]])
def test_several_pods_on_a_single_writer_cache_are_refused(sets: list[str]) -> None:
    with pytest.raises(UserError, match="ReadWriteOnce model cache: a second pod"):
        render(*sets)
    render(*sets, "modelCache.existingClaim=rwx-weights")  # the user's own shared claim


def test_autoscaling_with_distributed_is_refused() -> None:
    with pytest.raises(UserError, match="scale the RayCluster"):
        render(
            "autoscaling.enabled=true",
            "distributed.enabled=true",
            "modelCache.accessModes={ReadWriteMany}",
        )
