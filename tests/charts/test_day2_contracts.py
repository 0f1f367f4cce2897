"""Day-2 contracts: what the kubelet, the Deployment controller (and through kstatus Helm's
`--wait`), KubeRay, KEDA, NetworkPolicy and vLLM's own parsing do with the renders when the
release is upgraded, drained, scaled, restricted or runs with an API key.

Each check reads the render the way its consumer does (tests/charts/consumers.py) and fails
on a chart whose render that system would turn into an outage.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from dflash_ops.chart.helm import engine_args_in_render, helm_template
from dflash_ops.chart.values import chart_values
from dflash_ops.errors import UserError
from dflash_ops.paths import CHART_DIR, PROFILES_DIR
from dflash_ops.preflight.release_needs import PodGroup

from tests.charts.conftest import RWX, render_docs
from tests.charts.consumers import (
    Manifests,
    Peer,
    grace_seconds,
    hpa_scale_down_window,
    ingress_allowed,
    keda_hpa_behavior,
    kuberay_injected_probes,
    kuberay_recreate_hash,
    pod_templates,
    pods_kept_during_rollout,
    prestop_seconds,
    progress_deadline_seconds,
    service_link_variables,
    startup_budget_seconds,
)
from tests.conftest import REPO_ROOT

RAY_RENDERS = ("a100-2node-tp4-ray", "ray-data", "ray-auth")


def refused(*sets: str, values: list[Path] | None = None, release: str = "t") -> str:
    with pytest.raises(UserError) as err:
        helm_template(values or [], list(sets), release, "llm")
    return str(err.value)


def deployments(renders: dict[str, Manifests]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (name, doc)
        for name, manifests in renders.items()
        for (kind, _), doc in manifests.items()
        if kind == "Deployment"
    ]


def vllm_containers(template: dict[str, Any]) -> list[dict[str, Any]]:
    """Containers that run `vllm serve` (directly, or through the Ray head's script)."""
    return [
        c
        for c in template["spec"]["containers"]
        if c.get("command", [])[:2] == ["vllm", "serve"]
        or "ray-head.sh" in " ".join(c.get("command", []))
    ]


# -- Helm --wait / kstatus: the rollout deadline covers a cold start -------------------------


def test_no_rollout_is_reported_failed_while_the_engine_may_still_be_loading(
    renders: dict[str, Manifests],
) -> None:
    download = int(chart_values([])["modelDownload"]["budgetSeconds"])
    problems = []
    engine_budgets: dict[str, int] = {}
    routers = []
    for name, deployment in deployments(renders):
        template = deployment["spec"]["template"]
        engines = vllm_containers(template)
        if not engines:
            routers.append((name, deployment))  # ready once an engine is: checked below
            continue
        budget = max(startup_budget_seconds(c) for c in engines)
        if any(c["name"] == "model-download" for c in template["spec"].get("initContainers", [])):
            budget += download
        engine_budgets[name] = max(budget, engine_budgets.get(name, 0))
        deadline = progress_deadline_seconds(deployment)
        if deadline <= budget:
            problems.append(f"{name}: progressDeadlineSeconds {deadline} <= start budget {budget}")
    # The router is ready only while an engine is (/readiness): its rollout waits for theirs.
    for name, router in routers:
        budget = engine_budgets.get(name, 0)
        deadline = progress_deadline_seconds(router)
        if deadline <= budget:
            problems.append(
                f"{name} {router['metadata']['name']}: progressDeadlineSeconds {deadline} <= the "
                f"engines' start budget {budget}"
            )
    assert routers, "no render has a router"
    assert not problems, "\n".join(problems)


def test_a_bigger_startup_budget_moves_the_deadline() -> None:
    manifests = render_docs(
        [], ["probes.startup.failureThreshold=720", "modelDownload.budgetSeconds=7200"]
    )
    deployment = next(d for (k, _), d in manifests.items() if k == "Deployment")
    assert progress_deadline_seconds(deployment) > 7200 + 7200


# -- kubelet + vLLM: SIGTERM drains instead of aborting ---------------------------------------


def test_every_engine_drains_before_the_kubelet_kills_it(renders: dict[str, Manifests]) -> None:
    problems = []
    for name, manifests in renders.items():
        for where, template in pod_templates(manifests):
            for container in vllm_containers(template):
                args = container.get("args", [])
                label = f"{name}: {where} {container['name']}"
                if "--shutdown-timeout" not in args:
                    problems.append(f"{label}: no --shutdown-timeout: vLLM aborts running requests")
                    continue
                drain = int(args[args.index("--shutdown-timeout") + 1])
                hold = prestop_seconds(container)
                grace = grace_seconds(template["spec"])
                if drain <= 0 or hold < 5 or hold + drain >= grace:
                    problems.append(
                        f"{label}: preStop {hold}s + drain {drain}s must fit in the grace "
                        f"period {grace}s (and both be > 0)"
                    )
    assert not problems, "\n".join(problems)


def test_a_grace_period_too_short_to_drain_is_refused() -> None:
    message = refused("termination.gracePeriodSeconds=15", "termination.preStopSeconds=10")
    assert "termination.gracePeriodSeconds" in message and "preStopSeconds" in message


def test_the_grace_period_is_a_value() -> None:
    manifests = render_docs([], ["termination.gracePeriodSeconds=600"])
    template = next(t for _, t in pod_templates(manifests))
    engine = vllm_containers(template)[0]
    assert grace_seconds(template["spec"]) == 600
    args = engine["args"]
    assert int(args[args.index("--shutdown-timeout") + 1]) == 600 - prestop_seconds(engine) - 10


# -- kubelet service links: a Service named `vllm` must not break the engine ------------------


def test_no_pod_gets_service_link_variables(renders: dict[str, Manifests]) -> None:
    for name, manifests in renders.items():
        for where, template in pod_templates(manifests):
            assert service_link_variables(template["spec"], {"vllm": 8000}) == {}, f"{name} {where}"


def test_service_link_variables_would_stop_vllm() -> None:
    """What the kubelet injects for a Service named `vllm` makes vLLM refuse to start."""
    env = service_link_variables({}, {"vllm": 8000})
    assert env["VLLM_PORT"] == "tcp://10.0.0.1:8000"
    python = REPO_ROOT / ".venv" / "bin" / "python"
    result = subprocess.run(
        [str(python), "-c", "import vllm.envs as e; e.VLLM_PORT"],
        env={"VLLM_PORT": env["VLLM_PORT"], "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0 and "VLLM_PORT" in result.stderr


# -- auth: one Secret, every caller of /v1 ----------------------------------------------------


def api_key_source(container: dict[str, Any]) -> dict[str, Any] | None:
    for env in container.get("env", []):
        if env["name"] == "VLLM_API_KEY":
            return dict(env["valueFrom"]["secretKeyRef"])
    return None


@pytest.mark.parametrize("render", ["auth", "ray-auth", "router-auth-netpol"])
def test_the_key_reaches_the_doors_the_router_and_the_helm_tests_only(
    renders: dict[str, Manifests], render: str
) -> None:
    """The doors read both entries of the Secret as files (a rotated Secret reaches them without
    a restart); the helm tests send the current key; the router sends it on the calls it makes
    itself. vLLM and the sidecar sit behind the door on loopback and hold no key."""
    wanted = {"name": "vllm-api-key", "key": "api-key"}
    manifests = renders[render]
    doors = callers = 0
    for where, template in pod_templates(manifests):
        volumes = {v["name"]: v for v in template["spec"].get("volumes", [])}
        for container in template["spec"]["containers"]:
            mounted = {
                m["name"]: m["mountPath"]
                for m in container.get("volumeMounts", [])
                if "secret" in volumes.get(m["name"], {})
            }
            keys = [n for n in mounted if volumes[n]["secret"]["secretName"] == "vllm-api-key"]
            if container["name"] == "door":
                (volume,) = keys
                assert "items" not in volumes[volume]["secret"], "the optional next key"
                assert template["spec"]["securityContext"]["fsGroup"] == 1000  # mode 0440
                doors += 1
                assert api_key_source(container) is None
            elif container["name"] in ("vllm", "sidecar", "ray-head"):
                assert not keys and api_key_source(container) is None, f"{where}"
            elif where.startswith("Pod/") or container["name"] == "router":
                assert api_key_source(container) == wanted, f"{where} {container['name']}"
                callers += 1
    assert doors == (2 if render.startswith("router") else 1)
    assert callers >= 3
    # Never a key in an argument (`ps` shows it): the router's is the kubelet's $(VAR).
    for where, template in pod_templates(manifests):
        for container in template["spec"]["containers"]:
            args = [*container.get("command", []), *container.get("args", [])]
            for i, arg in enumerate(args):
                if arg.startswith("--api-key"):
                    assert args[i + 1 :][:1] == ["$(VLLM_API_KEY)"], f"{where} {arg}"


def test_no_key_no_variable(renders: dict[str, Manifests]) -> None:
    for _, template in pod_templates(renders["a100-tp2-dflash2"]):
        for container in template["spec"]["containers"]:
            assert api_key_source(container) is None


@pytest.mark.parametrize(
    "sets",
    [
        ["model.extraArgs={--api-key,secret}"],
        ["model.extraArgs={--api-key=secret}"],
        ["model.extraEnv[0].name=VLLM_API_KEY", "model.extraEnv[0].value=secret"],
    ],
)
def test_a_key_outside_auth_is_refused(sets: list[str]) -> None:
    assert "auth.apiKeySecret" in refused(*sets)


# -- flags the chart owns cannot be repeated in extraArgs --------------------------------------


def owned_flags() -> list[str]:
    """Every flag the chart renders for vLLM in any profile or layout."""
    flags: set[str] = set()
    layouts = [([p], []) for p in sorted(PROFILES_DIR.glob("*.yaml"))]
    layouts.append(([], ["distributed.enabled=true", "distributed.layout=data", RWX]))
    for values, sets in layouts:
        args = engine_args_in_render(helm_template(values, sets, "t", "llm"))
        flags |= {a.split("=", 1)[0] for a in args if a.startswith("--")}
    return sorted(flags | {"--api-key", "--host"})


@pytest.mark.parametrize("flag", owned_flags())
def test_repeating_a_chart_flag_in_extra_args_is_refused(flag: str) -> None:
    message = refused(f"model.extraArgs={{{flag}=1}}")
    assert flag in message and "use " in message
    underscored = "--" + flag[2:].replace("-", "_")
    assert flag in refused(f"model.extraArgs={{{underscored}=1}}")


def test_other_flags_pass_through() -> None:
    manifests = render_docs([], ["model.extraArgs={--max-num-seqs,64}"])
    args = next(d for (k, _), d in manifests.items() if k == "Deployment")["spec"]["template"][
        "spec"
    ]["containers"][0]["args"]
    assert args[args.index("--max-num-seqs") + 1] == "64"


# -- rollouts: replicas keep serving, a single replica never needs a second GPU set ------------


@pytest.mark.parametrize("render", ["replicas", "keda", "hpa", "keda-rolling"])
def test_with_several_replicas_a_rollout_keeps_serving_without_extra_gpus(
    renders: dict[str, Manifests], render: str
) -> None:
    deployment = next(d for (k, _), d in renders[render].items() if k == "Deployment")
    for replicas in (2, 3, 4):
        kept, most = pods_kept_during_rollout(deployment, replicas)
        assert kept >= replicas - 1 and most == replicas, (replicas, deployment["spec"]["strategy"])


def test_one_replica_is_replaced_in_place(renders: dict[str, Manifests]) -> None:
    deployment = next(d for (k, _), d in renders["a100-tp2-dflash2"].items() if k == "Deployment")
    assert pods_kept_during_rollout(deployment, 1)[1] == 1  # never two pods' worth of GPUs


# -- upgrades: what rolls, what does not ------------------------------------------------------


def chart_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "dflash-serve"
    shutil.copytree(CHART_DIR, copy, symlinks=False)
    return copy


def template_of(chart: Path, values: list[Path], sets: list[str]) -> dict[str, Any]:
    text = helm_template(values, sets, "dflash", "llm", chart=chart)
    docs = [d for d in yaml.safe_load_all(text) if d]
    found = {}
    for doc in docs:
        if doc["kind"] == "Deployment":
            found["deployment"] = doc["spec"]["template"]
        if doc["kind"] == "RayCluster":
            found["raycluster"] = kuberay_recreate_hash(doc["spec"])
    return found


def test_a_chart_release_without_changes_restarts_nothing(tmp_path: Path) -> None:
    ray = [PROFILES_DIR / "a100-2node-tp4-ray.yaml"]
    before = {**template_of(CHART_DIR, [], []), "ray": template_of(CHART_DIR, ray, [])}
    chart = chart_copy(tmp_path)
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    meta["version"] = "9.9.9"
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta))
    after = {**template_of(chart, [], []), "ray": template_of(chart, ray, [])}
    assert after == before


def test_a_changed_script_rolls_the_pods_that_run_it(tmp_path: Path) -> None:
    ray = [PROFILES_DIR / "a100-2node-tp4-ray.yaml"]
    before = template_of(CHART_DIR, [], []), template_of(CHART_DIR, ray, [])
    chart = chart_copy(tmp_path)
    for script in ("ray/ray-head.sh", "model-download/download-models.py"):
        path = chart / "files" / script
        path.write_text(path.read_text() + "\n# changed\n")
    after = template_of(chart, [], []), template_of(chart, ray, [])
    assert after[0]["deployment"] != before[0]["deployment"]
    assert after[1]["raycluster"] != before[1]["raycluster"]


def test_kuberay_recreates_the_ray_pods_on_a_new_k(renders: dict[str, Manifests]) -> None:
    ray = [PROFILES_DIR / "a100-2node-tp4-ray.yaml"]
    before = template_of(CHART_DIR, ray, [])["raycluster"]
    after = template_of(CHART_DIR, ray, ["speculative.numSpeculativeTokens=5"])["raycluster"]
    assert before != after
    for name in RAY_RENDERS:
        cluster = next(d for (k, _), d in renders[name].items() if k == "RayCluster")
        # Without Recreate, KubeRay (>= 1.6 reads it) leaves running pods on the old spec.
        assert cluster["spec"]["upgradeStrategy"] == {"type": "Recreate"}, name


# -- KubeRay: no injected probe that needs the dashboard agent --------------------------------


@pytest.mark.parametrize("render", RAY_RENDERS)
def test_kuberay_injects_no_probe(renders: dict[str, Manifests], render: str) -> None:
    cluster = next(d for (k, _), d in renders[render].items() if k == "RayCluster")
    groups = [cluster["spec"]["headGroupSpec"], *cluster["spec"]["workerGroupSpecs"]]
    for group in groups:
        ray_container = group["template"]["spec"]["containers"][0]
        assert kuberay_injected_probes(ray_container) == [], group.get("groupName", "head")
    params = cluster["spec"]["headGroupSpec"]["rayStartParams"]
    assert params.get("include-dashboard") == "false"  # no dashboard, no Jobs API on 8265


def test_the_ray_version_is_the_engine_images() -> None:
    pin = (REPO_ROOT / "docker" / "ray-version.txt").read_text().strip()
    dockerfile = (REPO_ROOT / "docker" / "vllm.Dockerfile").read_text()
    assert "ray-version.txt" in dockerfile and "ray[default]" in dockerfile
    manifests = render_docs([PROFILES_DIR / "a100-2node-tp4-ray.yaml"], [])
    cluster = next(d for (k, _), d in manifests.items() if k == "RayCluster")
    assert cluster["spec"]["rayVersion"] == pin
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    assert f'"ray[default]=={pin}"' in pyproject  # the local two-node Ray test's Ray


def test_ray_cluster_names_kuberay_refuses_are_refused() -> None:
    ray = [PROFILES_DIR / "a100-2node-tp4-ray.yaml"]
    message = refused(f"fullnameOverride={'a' * 54}", values=ray)
    assert "53" in message and "fullnameOverride" in message
    render_docs(ray, [f"fullnameOverride={'a' * 53}"])  # the limit itself is fine
    assert "DNS-1035" in refused(values=ray, release="9lives")  # Helm takes it, KubeRay not


# -- KEDA: scale-down follows the same window as the HPA mode --------------------------------


def test_keda_scales_down_like_the_hpa_mode(renders: dict[str, Manifests]) -> None:
    scaled = next(d for (k, _), d in renders["keda"].items() if k == "ScaledObject")
    hpa = next(d for (k, _), d in renders["hpa"].items() if k == "HorizontalPodAutoscaler")
    keda_window = hpa_scale_down_window(keda_hpa_behavior(scaled))
    assert keda_window == hpa_scale_down_window(hpa["spec"].get("behavior"))
    assert keda_window == int(chart_values([])["autoscaling"]["cooldownSeconds"])


def test_min_above_max_replicas_is_refused() -> None:
    message = refused(
        "autoscaling.enabled=true", "autoscaling.minReplicas=5", "autoscaling.maxReplicas=2", RWX
    )
    assert "autoscaling.minReplicas" in message


# -- NetworkPolicy --------------------------------------------------------------------------

LLM_NS = {"kubernetes.io/metadata.name": "llm"}


def policies(manifests: Manifests) -> list[dict[str, Any]]:
    return [d for (k, _), d in manifests.items() if k == "NetworkPolicy"]


def pod_of(manifests: Manifests, where_part: str) -> tuple[dict[str, str], dict[str, int]]:
    for where, template in pod_templates(manifests):
        if where_part in where:
            ports = {
                p["name"]: p["containerPort"]
                for c in template["spec"]["containers"]
                for p in c.get("ports", [])
                if "name" in p
            }
            return template["metadata"]["labels"], ports
    raise AssertionError(f"no pod {where_part}")


def test_clients_in_the_namespace_and_allowed_namespaces_reach_the_api() -> None:
    manifests = render_docs(
        [], ["networkPolicy.enabled=true", "networkPolicy.allowedNamespaceLabels.team=ml"]
    )
    labels, ports = pod_of(manifests, "Deployment/")
    test_pod = next(d for (k, _), d in manifests.items() if k == "Pod")
    rules = policies(manifests)

    def allowed(peer: Peer, port: int) -> bool:
        return ingress_allowed(rules, peer, "llm", labels, ports, port)

    helm_test = Peer("llm", LLM_NS, test_pod["metadata"]["labels"])
    assert allowed(helm_test, 8000)
    assert allowed(Peer("apps", {"team": "ml"}, {"app": "web"}), 8000)
    assert not allowed(Peer("apps", {"team": "ml"}, {"app": "web"}), 9100)
    assert not allowed(Peer("other", {"team": "web"}, {}), 8000)
    prometheus = Peer("monitoring", {"kubernetes.io/metadata.name": "monitoring"}, {})
    assert allowed(prometheus, 8000) and allowed(prometheus, 9100)


def test_ray_ports_are_closed_to_everyone_but_the_release_and_the_operators_gcs(
    renders: dict[str, Manifests],
) -> None:
    manifests = renders["a100-2node-tp4-ray"]  # networkPolicy.enabled: auto is on here
    rules = policies(manifests)
    assert rules
    head_labels, head_ports = pod_of(manifests, "head")
    worker_labels = next(
        t["metadata"]["labels"]
        for where, t in pod_templates(manifests)
        if where.startswith("RayCluster/") and not where.endswith(" head")
    )

    def allowed(peer: Peer, port: int) -> bool:
        return ingress_allowed(rules, peer, "llm", head_labels, head_ports, port)

    worker = Peer("llm", LLM_NS, worker_labels)
    stranger = Peer("llm", LLM_NS, {"app": "notebook"})
    operator = Peer("ray-system", {"kubernetes.io/metadata.name": "ray-system"}, {})
    for port in (6379, 8265, 10001, 52365):
        assert allowed(worker, port), port
        assert not allowed(stranger, port), port
    assert allowed(operator, 6379)
    assert not allowed(operator, 8265) and not allowed(operator, 10001)
    assert allowed(stranger, 8000)  # the API stays open to the namespace


# -- placement --------------------------------------------------------------------------------


def node_fits(spec: dict[str, Any], labels: dict[str, str]) -> bool:
    """The scheduler's node filter (nodeSelector, required node affinity: terms ORed,
    expressions ANDed), as preflight applies it."""
    group = PodGroup("pod", 1, 1, "nvidia.com/gpu", {}, None, [])
    required = (
        spec.get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    group = replace(
        group,
        node_selector=dict(spec.get("nodeSelector", {})),
        node_terms=list(required["nodeSelectorTerms"]) if required else None,
    )
    return group.fits(labels, [])


def engine_spec(sets: list[str], values: list[Path] | None = None) -> dict[str, Any]:
    manifests = render_docs(values or [], sets)
    return next(t for _, t in pod_templates(manifests))["spec"]


PRODUCT = "nvidia.com/gpu.product"


def test_gpu_type_selects_its_products() -> None:
    h100 = engine_spec(["gpu.type=h100"])
    assert node_fits(h100, {PRODUCT: "NVIDIA-H100-80GB-HBM3"})
    assert not node_fits(h100, {PRODUCT: "NVIDIA-A100-SXM4-80GB"})
    a100 = engine_spec([])
    assert node_fits(a100, {PRODUCT: "NVIDIA-A100-SXM4-80GB"})
    assert not node_fits(a100, {PRODUCT: "NVIDIA-H100-80GB-HBM3"})
    assert not node_fits(a100, {})


def test_product_affinity_can_be_off_for_clusters_without_feature_discovery() -> None:
    spec = engine_spec(["gpu.productAffinity=false"])
    assert node_fits(spec, {})


def test_products_of_another_gpu_are_refused() -> None:
    message = refused("gpu.products={NVIDIA-H100-80GB-HBM3}")
    assert "gpu.products" in message and "gpu.type" in message


def test_a_users_node_affinity_is_added_to_the_gpu_term(tmp_path: Path) -> None:
    values = tmp_path / "zone.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {
                                            "key": "topology.kubernetes.io/zone",
                                            "operator": "In",
                                            "values": ["eu-1a"],
                                        }
                                    ]
                                }
                            ]
                        }
                    }
                }
            }
        )
    )
    spec = engine_spec([], [values])
    gpu = {PRODUCT: "NVIDIA-A100-SXM4-80GB"}
    assert node_fits(spec, {**gpu, "topology.kubernetes.io/zone": "eu-1a"})
    assert not node_fits(spec, {**gpu, "topology.kubernetes.io/zone": "eu-1b"})
    assert not node_fits(spec, {"topology.kubernetes.io/zone": "eu-1a"})


# -- storage ----------------------------------------------------------------------------------


def test_without_a_model_cache_the_weights_have_bounded_requested_scratch(
    renders: dict[str, Manifests],
) -> None:
    spec = next(t for _, t in pod_templates(renders["no-model-cache"]))["spec"]
    tmp = next(v for v in spec["volumes"] if v["name"] == "tmp")
    size = chart_values([])["modelCache"]["size"]
    assert tmp["emptyDir"]["sizeLimit"] == size  # the kubelet evicts past it, not the node
    requested = [c["resources"]["requests"].get("ephemeral-storage") for c in spec["containers"]]
    assert size in requested  # the scheduler places the pod where that much disk is free


# -- values the API server or the controllers would refuse, or that never drain ----------------


@pytest.mark.parametrize(
    ("sets", "names"),
    [
        (["podDisruptionBudget.maxUnavailable=-1"], "podDisruptionBudget/maxUnavailable"),
        (["podDisruptionBudget.maxUnavailable=150%"], "podDisruptionBudget.maxUnavailable"),
        (["podDisruptionBudget.maxUnavailable=abc"], "podDisruptionBudget/maxUnavailable"),
        (["podDisruptionBudget.maxUnavailable=0"], "blocks every node drain"),
        (["modelCache.size=32GB"], "modelCache/size"),
        (["scratch.sizeLimit=lots"], "scratch/sizeLimit"),
        (["engine.port=9100"], "engine.port and sidecar.port"),
        (["gpu.type=h100", "gpu.products={NVIDIA-A100-SXM4-80GB}"], "gpu.products"),
    ],
)
def test_impossible_values_are_refused_by_name(sets: list[str], names: str) -> None:
    assert names in refused(*sets)


def test_a_percentage_pdb_renders() -> None:
    manifests = render_docs([], ["podDisruptionBudget.maxUnavailable=50%"])
    pdb = next(d for (k, _), d in manifests.items() if k == "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == "50%"
