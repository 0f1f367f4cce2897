"""The router (router.enabled): judged by what vLLM's router, the API server's RBAC and the
network do with the render.

- vllm-router 0.1.17's own argument parser reads the rendered arguments;
- its Kubernetes service discovery lists the pods of `--service-discovery-namespace` that match
  every `--selector` key=value and sends to `--service-discovery-port`: evaluated against the
  rendered pods of two releases in one namespace, it must find exactly this release's serving
  pods (not the other release's, not Ray workers, not itself, not the helm test pods);
- the API server authorizes its watch through RoleBinding -> Role of its ServiceAccount;
- the kubelet expands $(VAR) in arguments from the container's env only;
- NetworkPolicy: clients reach the router, the router reaches the engines, Prometheus both.
"""

from __future__ import annotations

from typing import Any

import pytest
from dflash_ops.chart.helm import engine_args_in_render, helm_template

from tests.charts.conftest import RWX, Manifests, arg_after, render
from tests.charts.consumers import Peer, ingress_allowed, pod_templates, selector_matches

ROUTER = ["router.enabled=true", "replicas=2", RWX]


def router_deployment(manifests: Manifests) -> dict[str, Any]:
    (found,) = [
        doc
        for (kind, name), doc in manifests.items()
        if kind == "Deployment" and name.endswith("-router")
    ]
    return found


def router_container(manifests: Manifests, name: str = "router") -> dict[str, Any]:
    """The router's container (name="door": the door in front of it, in the same pod)."""
    (container,) = [
        c
        for c in router_deployment(manifests)["spec"]["template"]["spec"]["containers"]
        if c["name"] == name
    ]
    return container


def values_after(args: list[str], flag: str) -> list[str]:
    """An nargs='+' option's values: up to the next flag."""
    start = args.index(flag) + 1
    end = next((i for i in range(start, len(args)) if args[i].startswith("--")), len(args))
    return args[start:end]


def discovered(router: dict[str, Any], pods: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """What the router's service discovery watches: pods of its namespace with every label."""
    (args,) = [
        c["args"] for c in router["spec"]["template"]["spec"]["containers"] if c["name"] == "router"
    ]
    assert "--service-discovery" in args
    wanted = dict(item.split("=", 1) for item in values_after(args, "--selector"))
    namespace = arg_after(args, "--service-discovery-namespace")
    return [
        where
        for where, template in pods
        if template["metadata"].get("namespace", "llm") == namespace
        and all(template["metadata"]["labels"].get(k) == v for k, v in wanted.items())
    ]


def serving_pods(manifests: Manifests) -> list[str]:
    """Pods whose containers listen on the engine port: what the engine Service selects."""
    service = next(
        doc
        for (kind, name), doc in manifests.items()
        if kind == "Service" and not name.endswith(("-router", "-pods"))
    )
    return [
        where
        for where, template in pod_templates(manifests)
        if selector_matches(
            {"matchLabels": service["spec"]["selector"]}, template["metadata"]["labels"]
        )
    ]


@pytest.mark.parametrize(
    "layout",
    [[], ["distributed.enabled=true"], ["distributed.enabled=true", "distributed.layout=data"]],
    ids=["deployment", "ray-tensor", "ray-data"],
)
def test_the_router_finds_exactly_its_own_releases_engines(layout: list[str]) -> None:
    releases = {name: render(*ROUTER, *layout, release=name) for name in ("alpha", "beta")}
    every_pod = [
        (f"{name}: {where}", template)
        for name, manifests in releases.items()
        for where, template in pod_templates(manifests)
    ]
    for name, manifests in releases.items():
        found = discovered(router_deployment(manifests), every_pod)
        expected = [f"{name}: {where}" for where in serving_pods(manifests)]
        assert expected, f"{name}: no serving pod rendered"
        assert sorted(found) == sorted(expected), name
        # ... and it sends to the port those pods serve the API on.
        args = router_container(manifests)["args"]
        port = int(arg_after(args, "--service-discovery-port"))
        for where, template in pod_templates(manifests):
            if where in serving_pods(manifests):
                served = {
                    p["containerPort"]
                    for c in template["spec"]["containers"]
                    for p in c.get("ports", [])
                }
                assert port in served, where


def test_its_service_account_may_watch_pods_in_the_release_namespace_and_nothing_else() -> None:
    manifests = render(*ROUTER)
    pod = router_deployment(manifests)["spec"]["template"]["spec"]
    account = pod["serviceAccountName"]
    # The pod's own setting wins over the ServiceAccount's: the token is mounted.
    assert pod["automountServiceAccountToken"] is True
    bindings = [
        doc
        for (kind, _), doc in manifests.items()
        if kind == "RoleBinding"
        and any(s["kind"] == "ServiceAccount" and s["name"] == account for s in doc["subjects"])
    ]
    assert len(bindings) == 1
    binding = bindings[0]
    assert binding["metadata"]["namespace"] == "llm"
    assert all(s.get("namespace") == "llm" for s in binding["subjects"])
    role = manifests[("Role", binding["roleRef"]["name"])]
    assert binding["roleRef"]["kind"] == "Role"  # never a ClusterRole
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    args = router_container(manifests)["args"]
    assert arg_after(args, "--service-discovery-namespace") == role["metadata"]["namespace"]
    assert not any(kind == "ClusterRoleBinding" for kind, _ in manifests)


def test_vllm_routers_own_parser_reads_the_arguments() -> None:
    parser = pytest.importorskip(
        "vllm_router.launch_router", reason="the router extra (vllm-router) is not installed"
    )
    manifests = render(*ROUTER, "auth.apiKeySecret.name=vllm-api-key")
    parsed = parser.parse_router_args(router_container(manifests)["args"])
    assert parsed.service_discovery is True
    assert parsed.selector == {
        "app.kubernetes.io/instance": "t",
        "app.kubernetes.io/name": "dflash-serve",
        "dflash-serve.io/component": "engine",
    }
    assert parsed.service_discovery_namespace == "llm"
    assert parsed.service_discovery_port == 8000
    assert parsed.policy == "cache_aware"
    # Behind the door on loopback (its admin API is unreachable from outside the pod); the
    # metrics port is its own, for Prometheus.
    assert parsed.host == "127.0.0.1" and parsed.port == 8081
    assert parsed.prometheus_host == "0.0.0.0"
    assert parsed.api_key == "$(VLLM_API_KEY)"  # the kubelet expands it: see below
    assert parsed.health_check_interval_secs == 10


def test_the_api_key_reaches_the_router_through_the_kubelets_expansion_only() -> None:
    router = router_container(render(*ROUTER, "auth.apiKeySecret.name=vllm-api-key"))
    args = router["args"]
    assert arg_after(args, "--api-key") == "$(VLLM_API_KEY)"
    (variable,) = [e for e in router["env"] if e["name"] == "VLLM_API_KEY"]
    assert variable["valueFrom"]["secretKeyRef"] == {"name": "vllm-api-key", "key": "api-key"}
    assert "--api-key" not in router_container(render(*ROUTER))["args"]


@pytest.mark.parametrize(
    ("policy", "scale_out"),
    [("cache_aware", True), ("round_robin", False), ("consistent_hash", False)],
)
def test_engines_serve_the_render_endpoints_only_for_cache_aware(
    policy: str, scale_out: bool
) -> None:
    text = helm_template([], [*ROUTER, f"router.policy={policy}"], "t", "llm")
    assert ("--enable-scale-out" in engine_args_in_render(text)) is scale_out
    assert "--enable-scale-out" not in engine_args_in_render(helm_template([], [], "t", "llm"))


def test_clients_reach_the_router_and_the_router_reaches_the_engines() -> None:
    manifests = render(*ROUTER, "networkPolicy.enabled=true")
    policies = [doc for (kind, _), doc in manifests.items() if kind == "NetworkPolicy"]
    router_pod = router_deployment(manifests)["spec"]["template"]
    engine_pod = next(
        t for w, t in pod_templates(manifests) if w.startswith("Deployment/") and "-router" not in w
    )

    def ports(template: dict[str, Any]) -> dict[str, int]:
        return {
            p["name"]: p["containerPort"]
            for c in template["spec"]["containers"]
            for p in c.get("ports", [])
        }

    ns = {"kubernetes.io/metadata.name": "llm"}
    client = Peer("llm", ns, {"app": "client"})
    router = Peer("llm", ns, router_pod["metadata"]["labels"])
    prometheus = Peer("monitoring", {"kubernetes.io/metadata.name": "monitoring"}, {})
    stranger = Peer("other", {"kubernetes.io/metadata.name": "other"}, {})

    def allowed(source: Peer, target: dict[str, Any], port: str) -> bool:
        return ingress_allowed(
            policies,
            source,
            "llm",
            target["metadata"]["labels"],
            ports(target),
            ports(target)[port],
        )

    assert allowed(client, router_pod, "http")
    assert allowed(router, engine_pod, "http")
    assert allowed(prometheus, router_pod, "metrics")
    assert not allowed(stranger, router_pod, "http")
    assert not allowed(stranger, router_pod, "metrics")
    assert not allowed(client, router_pod, "metrics")


def test_the_router_is_scraped_on_the_port_it_declares() -> None:
    manifests = render(*ROUTER)
    monitor = manifests[("PodMonitor", "t-dflash-serve-router")]
    router_pod = router_deployment(manifests)["spec"]["template"]
    assert selector_matches(monitor["spec"]["selector"], router_pod["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    container = router_container(manifests)
    declared = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert declared[endpoint["port"]] == int(arg_after(container["args"], "--prometheus-port"))
    # The engine PodMonitor does not pick up the router pods (no double scrape, no gaps).
    engine_monitor = manifests[("PodMonitor", "t-dflash-serve")]
    assert not selector_matches(
        engine_monitor["spec"]["selector"], router_pod["metadata"]["labels"]
    )


def test_clients_are_pointed_at_the_router() -> None:
    manifests = render(*ROUTER)
    service = manifests[("Service", "t-dflash-serve-router")]
    router_pod = router_deployment(manifests)["spec"]["template"]
    assert selector_matches(
        {"matchLabels": service["spec"]["selector"]}, router_pod["metadata"]["labels"]
    )
    chats = [
        doc
        for (kind, name), doc in manifests.items()
        if kind == "Pod" and name.endswith(("-test-chat", "-test-tool-call"))
    ]
    assert chats
    for pod in chats:
        args = pod["spec"]["containers"][0]["args"]
        assert arg_after(args, "--base-url") == "http://t-dflash-serve-router:8000"


@pytest.mark.parametrize(
    ("sets", "named"),
    [
        (["router.extraArgs={--selector,app=x}"], "--selector"),
        (["router.extraArgs={--api-key=secret}"], "--api-key"),
        (["router.extraArgs={--worker-urls,http://x:8000}"], "--worker-urls"),
        (["router.policy=kv_aware"], "/router/policy"),
        (["router.replicas=0"], "/router/replicas"),
        (["router.retries.maxAttempts=0"], "/router/retries/maxAttempts"),
    ],
)
def test_bad_router_values_are_refused_by_name(sets: list[str], named: str) -> None:
    from dflash_ops.errors import UserError

    with pytest.raises(UserError) as refused:
        helm_template([], [*ROUTER, *sets], "t", "llm")
    assert named in str(refused.value)
