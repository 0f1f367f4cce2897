from __future__ import annotations

import pytest
from dflash_ops.errors import UserError

from tests.charts.conftest import one, render


def test_keda_scales_on_waiting_requests() -> None:
    scaled = one(render("autoscaling.enabled=true"), "ScaledObject")
    trigger = scaled["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus"
    assert (
        trigger["metadata"]["query"]
        == 'sum(vllm:num_requests_waiting{namespace="llm", release="t"})'
    )
    assert scaled["spec"]["scaleTargetRef"]["name"] == "t-dflash-serve"


def test_hpa_alternative_keeps_the_gpu_safe_rollout() -> None:
    manifests = render(
        "autoscaling.enabled=true", "autoscaling.engine=hpa", "rollout.strategy=RollingUpdate"
    )
    hpa = one(manifests, "HorizontalPodAutoscaler")
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "vllm_num_requests_waiting"
    assert one(manifests, "Deployment")["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0


def test_autoscaling_with_distributed_is_refused() -> None:
    with pytest.raises(UserError, match="scale the RayCluster"):
        render(
            "autoscaling.enabled=true",
            "distributed.enabled=true",
            "modelCache.accessModes={ReadWriteMany}",
        )
