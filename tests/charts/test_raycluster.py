"""Multi-node serving on KubeRay: same block size, probes, shm, sidecar and monitoring."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dflash_ops.errors import UserError
from dflash_ops.plan import closed_form
from dflash_ops.plan.checkpoint import load_checkpoint
from dflash_ops.plan.model import BlockSizeInputs

from tests.charts.conftest import Manifests, one, render
from tests.charts.consumers import kuberay_token_env, pod_templates
from tests.charts.test_day2_contracts import refused
from tests.conftest import find_tool

RAY = ["distributed.enabled=true", "modelCache.accessModes={ReadWriteMany}"]


@pytest.fixture(scope="module")
def ray_tp4() -> Manifests:
    return render(*RAY)


CHART = Path(__file__).resolve().parents[2] / "charts" / "dflash-serve"


def one_configmap(manifests: Manifests, name: str) -> dict:  # type: ignore[type-arg]
    return manifests[("ConfigMap", name)]


def head(manifests: Manifests) -> dict:  # type: ignore[type-arg]
    return one(manifests, "RayCluster")["spec"]["headGroupSpec"]["template"]


def worker(manifests: Manifests) -> dict:  # type: ignore[type-arg]
    return one(manifests, "RayCluster")["spec"]["workerGroupSpecs"][0]["template"]


def head_engine(manifests: Manifests) -> dict:  # type: ignore[type-arg]
    return head(manifests)["spec"]["containers"][0]  # type: ignore[no-any-return]


def test_tp4_over_two_nodes_replaces_the_deployment(ray_tp4: Manifests) -> None:
    assert not [k for k in ray_tp4 if k[0] == "Deployment"]
    cluster = one(ray_tp4, "RayCluster")
    assert cluster["spec"]["workerGroupSpecs"][0]["replicas"] == 1
    engine = head_engine(ray_tp4)
    assert engine["command"] == ["/bin/bash", "/etc/dflash-serve/ray/ray-head.sh"]
    args = engine["args"]
    assert args[:3] == ["vllm", "serve", "Qwen/Qwen3.8-Flash-Next-AWQ"]
    assert args[args.index("--tensor-parallel-size") + 1] == "4"
    assert args[args.index("--distributed-executor-backend") + 1] == "ray"
    plan = closed_form.plan_block_size(load_checkpoint(), BlockSizeInputs(gpu="a100", tp=4, k=7))
    assert args[args.index("--block-size") + 1] == str(plan.recommended_block_size)
    env = {e["name"]: e for e in engine["env"]}
    assert env["DFLASH_RAY_EXPECTED_NODES"]["value"] == "2"
    assert env["DFLASH_RAY_EXPECTED_GPUS"]["value"] == "4"
    assert env["VLLM_HOST_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    script = one_configmap(ray_tp4, "t-dflash-serve-ray-scripts")["data"]["ray-head.sh"]
    assert script == (CHART / "files" / "ray" / "ray-head.sh").read_text()


def test_head_keeps_probes_sidecar_and_shm_workers_get_gpus(ray_tp4: Manifests) -> None:
    head_spec = head(ray_tp4)["spec"]
    names = [c["name"] for c in head_spec["containers"]]
    assert names == ["ray-head", "sidecar"]
    engine = head_spec["containers"][0]
    assert engine["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 9100}
    # The startup budget covers the workers joining (15 min) as well as the cold load (60 min).
    startup = engine["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 3600 + 900
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == 2
    for spec in (head_spec, worker(ray_tp4)["spec"]):
        assert any(v["name"] == "dshm" for v in spec["volumes"])
    worker_container = worker(ray_tp4)["spec"]["containers"][0]
    assert worker_container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert "args" not in worker_container
    # Explicit probes, so KubeRay does not inject its own (which ask the dashboard agent on
    # 52365, absent from the engine image): they run the raylet check the chart ships.
    # The script path must be a file the kubelet mounts from the chart's ConfigMap.
    worker_spec = worker(ray_tp4)["spec"]
    volumes = {v["name"]: v for v in worker_spec["volumes"]}
    scripts = one_configmap(ray_tp4, "t-dflash-serve-ray-scripts")["data"]
    for probe in ("livenessProbe", "readinessProbe"):
        path = worker_container[probe]["exec"]["command"][-1]
        mount = next(
            m for m in worker_container["volumeMounts"] if path.startswith(m["mountPath"] + "/")
        )
        source = volumes[mount["name"]]["configMap"]["name"]
        assert source == "t-dflash-serve-ray-scripts"
        assert (
            scripts[path.rsplit("/", 1)[1]]
            == (CHART / "files" / "ray" / "raylet-alive.py").read_text()
        )
        assert "52365" not in json.dumps(worker_container[probe])
    worker_env = {e["name"] for e in worker_container["env"]}
    assert "VLLM_HOST_IP" in worker_env


def test_monitoring_selects_the_head_only(ray_tp4: Manifests) -> None:
    labels = one(ray_tp4, "PodMonitor")["spec"]["selector"]["matchLabels"]
    assert labels["dflash-serve.io/component"] == "engine"
    assert head(ray_tp4)["metadata"]["labels"]["dflash-serve.io/component"] == "engine"
    assert worker(ray_tp4)["metadata"]["labels"]["dflash-serve.io/component"] == "ray-worker"
    for (kind, _), service in ray_tp4.items():
        if kind == "Service":
            assert service["spec"]["selector"]["dflash-serve.io/component"] == "engine"


def test_data_parallel_with_expert_parallel() -> None:
    manifests = render(
        *RAY,
        "distributed.layout=data",
        "distributed.dataParallelSize=2",
        "engine.tensorParallelSize=2",
    )
    args = head_engine(manifests)["args"]
    assert args[args.index("--data-parallel-size") + 1] == "2"
    assert args[args.index("--data-parallel-backend") + 1] == "ray"
    assert "--enable-expert-parallel" in args
    assert args[args.index("--tensor-parallel-size") + 1] == "2"


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["distributed.pipelineParallelSize=2"], "requires pipeline_parallel_size 1 for Qwen4Exp"),
        (["distributed.gpusPerNode=3"], "tensor-parallel size 6 does not divide"),
        (["distributed.nodes=1"], "distributed.nodes must be at least 2"),
        (["distributed.layout=pipeline"], 'distributed.layout "pipeline" is unknown'),
        (
            ["distributed.layout=data", "distributed.dataParallelSize=3"],
            "distributed.dataParallelSize 3 x engine.tensorParallelSize 2 must equal",
        ),
    ],
)
def test_unsupported_layouts_are_refused(sets: list[str], message: str) -> None:
    with pytest.raises(UserError) as err:
        render(*RAY, *sets)
    assert message in str(err.value)


def test_single_writer_cache_is_refused_across_nodes() -> None:
    with pytest.raises(UserError, match="ReadWriteMany"):
        render("distributed.enabled=true")


@pytest.mark.parametrize("version", ["1.29.0", "1.37.0"])
def test_ray_pod_templates_are_valid_kubernetes(
    ray_tp4: Manifests, version: str, tmp_path: Path
) -> None:
    # No KubeRay CRD schema ships in a package here: its pod templates (the bulk of it) are
    # checked as core PodTemplates, strictly; its own fields by the tests above.
    docs = [
        {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": name},
            "template": template,
        }
        for name, template in (("head", head(ray_tp4)), ("worker", worker(ray_tp4)))
    ]
    path = tmp_path / "ray-pods.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    result = subprocess.run(
        [find_tool("kubernetes-validate"), "--strict", "-k", version, "--quiet", str(path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def in_own_pid_namespace(script: str) -> subprocess.CompletedProcess[str]:
    """Run bash `script` as a pod would see /proc: a fresh PID namespace with its own /proc."""
    return subprocess.run(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "--pid",
            "--fork",
            "--mount-proc",
            "bash",
            "-c",
            script,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_worker_probe_follows_the_raylet(tmp_path: Path) -> None:
    probe = CHART / "files" / "ray" / "raylet-alive.py"
    if in_own_pid_namespace("true").returncode != 0:
        pytest.skip(
            "no user and PID namespaces here (unshare refused): the probe runs in the e2e Ray test"
        )
    python = sys.executable
    alone = in_own_pid_namespace(f"{python} {probe}")
    assert alone.returncode == 1, alone.stderr  # no raylet in the pod: not alive
    # A process whose argv[0] is Ray's raylet binary (…/ray/core/src/ray/raylet/raylet).
    fake = tmp_path / "raylet"
    fake.symlink_to(shutil.which("sleep") or "/bin/sleep")
    running = in_own_pid_namespace(f"{fake} 30 & sleep 0.2; {python} {probe}")
    assert running.returncode == 0, running.stderr


@pytest.mark.parametrize(
    "sets",
    [
        [],
        ["distributed.layout=data"],
        ["auth.apiKeySecret.name=k", "router.enabled=true"],
        ["distributed.rayAuth.secretName=our-ray-token"],
    ],
    ids=["tensor", "data", "door-and-router", "own-secret"],
)
def test_every_ray_process_needs_the_clusters_token(sets: list[str]) -> None:
    """As KubeRay builds the pods: the Ray container of the head and of every worker runs Ray
    with token authentication and the token from one Secret, so none of Ray's ports (GCS, Ray
    Client, raylets) answers without it; nothing the chart sets turns it off."""
    manifests = render(*RAY, *sets)
    cluster = one(manifests, "RayCluster")
    secret = "our-ray-token" if sets and "secretName" in sets[0] else cluster["metadata"]["name"]
    want = {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": {"secretKeyRef": {"name": secret, "key": "auth_token"}},
    }
    templates = [t for where, t in pod_templates(manifests) if where.startswith("RayCluster/")]
    assert len(templates) == 2
    for template in templates:
        assert kuberay_token_env(cluster, template) == want
        # The Ray container is the one that starts Ray (KubeRay's RayContainerIndex 0).
        assert template["spec"]["containers"][0]["name"] in ("ray-head", "ray-worker")
    assert "include-dashboard" in cluster["spec"]["headGroupSpec"]["rayStartParams"]


def test_ray_without_its_network_policy_is_refused_by_name() -> None:
    message = refused(*RAY, "networkPolicy.enabled=false")
    assert "networkPolicy.enabled is false with distributed.enabled" in message
    assert "networkPolicy.allowUnprotectedRay: true" in message
    accepted = render(*RAY, "networkPolicy.enabled=false", "networkPolicy.allowUnprotectedRay=true")
    assert not [k for k in accepted if k[0] == "NetworkPolicy"]
    assert one(accepted, "RayCluster")["spec"]["authOptions"] == {"mode": "token"}
    # Outside the Ray layout the value changes nothing, and false stays allowed.
    assert not [k for k in render("networkPolicy.enabled=false") if k[0] == "NetworkPolicy"]


def test_ray_auth_takes_token_or_disabled_only() -> None:
    off = render(*RAY, "distributed.rayAuth.mode=disabled")
    assert one(off, "RayCluster")["spec"]["authOptions"] == {"mode": "disabled"}
    assert "rayAuth" in refused(*RAY, "distributed.rayAuth.mode=tokens")
