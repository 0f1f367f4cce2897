"""What preflight checks in a cluster, from the chart's values: each check with what to fix."""

from __future__ import annotations

import json
import sys
from typing import Any, Protocol

from pydantic import BaseModel

DEFAULT_CLASS_ANNOTATIONS = (
    "storageclass.kubernetes.io/is-default-class",
    "storageclass.beta.kubernetes.io/is-default-class",
)


class ClusterReader(Protocol):
    """The few reads preflight makes; the real one wraps the kubernetes client."""

    def nodes(self) -> list[Any]: ...
    def crd_names(self) -> set[str]: ...
    def storage_classes(self) -> list[Any]: ...
    def daemonsets(self) -> list[Any]: ...
    def namespace_exists(self, name: str) -> bool: ...
    def secret_keys(self, namespace: str, name: str) -> set[str] | None: ...


class Check(BaseModel):
    name: str
    ok: bool
    detail: str
    fix: str = ""


def _quantity(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def check_cluster(values: dict[str, Any], namespace: str, cluster: ClusterReader) -> list[Check]:
    checks: list[Check] = []
    gpu = values["gpu"]
    distributed = values.get("distributed", {})
    multi = bool(distributed.get("enabled"))
    gpus_per_pod = int(
        distributed["gpusPerNode"] if multi else values["engine"]["tensorParallelSize"]
    )
    pods = int(distributed["nodes"] if multi else values.get("replicas", 1))
    resource = gpu["resourceName"]

    nodes = cluster.nodes()
    matching = [
        n for n in nodes if (n.metadata.labels or {}).get(gpu["productLabel"]) in gpu["products"]
    ]
    fitting = [
        n for n in matching if _quantity((n.status.allocatable or {}).get(resource)) >= gpus_per_pod
    ]
    slots = sum(
        _quantity((n.status.allocatable or {}).get(resource)) // gpus_per_pod for n in fitting
    )
    checks.append(
        Check(
            name="GPU nodes",
            ok=slots >= pods,
            detail=(
                f"{len(matching)} node(s) labelled {gpu['productLabel']} in {gpu['products']}; "
                f"{len(fitting)} with >= {gpus_per_pod} allocatable {resource}: room for {slots} "
                f"pod(s), the release needs {pods}"
            ),
            fix=(
                ""
                if slots >= pods
                else "add GPU nodes of that product, label them (GPU feature discovery sets "
                f"{gpu['productLabel']}), or change gpu.products / engine.tensorParallelSize"
            ),
        )
    )

    plugin_sets = [
        d for d in cluster.daemonsets() if "nvidia-device-plugin" in (d.metadata.name or "")
    ]
    advertised = [n for n in nodes if _quantity((n.status.allocatable or {}).get(resource)) > 0]
    plugin_ok = bool(plugin_sets) or bool(advertised)
    checks.append(
        Check(
            name="NVIDIA device plugin",
            ok=plugin_ok,
            detail=(
                "daemonset(s): "
                + (
                    ", ".join(f"{d.metadata.namespace}/{d.metadata.name}" for d in plugin_sets)
                    or "none found"
                )
                + f"; {len(advertised)} node(s) advertise {resource}"
            ),
            fix="" if plugin_ok else "install the NVIDIA GPU Operator or the k8s-device-plugin",
        )
    )

    cache = values["modelCache"]
    if cache.get("enabled") and not cache.get("existingClaim"):
        classes = cluster.storage_classes()
        wanted = cache.get("storageClass") or ""
        if wanted:
            ok = any(c.metadata.name == wanted for c in classes)
            detail = f"StorageClass {wanted} {'exists' if ok else 'not found'}"
            fix = "" if ok else f"create StorageClass {wanted} or set modelCache.storageClass"
        else:
            defaults = [
                c.metadata.name
                for c in classes
                if any(
                    (c.metadata.annotations or {}).get(a) == "true"
                    for a in DEFAULT_CLASS_ANNOTATIONS
                )
            ]
            ok = len(defaults) == 1
            detail = f"default StorageClass: {', '.join(defaults) or 'none'}"
            fix = "" if ok else "mark one StorageClass as default or set modelCache.storageClass"
        checks.append(Check(name="Model cache storage", ok=ok, detail=detail, fix=fix))

    crds = cluster.crd_names()
    needed: dict[str, str] = {}
    monitoring = values.get("monitoring", {})
    if monitoring.get("podMonitor", {}).get("enabled"):
        needed["podmonitors.monitoring.coreos.com"] = (
            "install Prometheus Operator (kube-prometheus-stack) or set "
            "monitoring.podMonitor.enabled=false"
        )
    if monitoring.get("prometheusRule", {}).get("enabled"):
        needed["prometheusrules.monitoring.coreos.com"] = (
            "install Prometheus Operator or set monitoring.prometheusRule.enabled=false"
        )
    if multi:
        needed["rayclusters.ray.io"] = "install the KubeRay operator (ray.io/v1 CRDs)"
    autoscaling = values.get("autoscaling", {})
    if autoscaling.get("enabled") and autoscaling.get("engine") == "keda":
        needed["scaledobjects.keda.sh"] = "install KEDA or set autoscaling.engine=hpa"
    for crd, fix in needed.items():
        present = crd in crds
        checks.append(
            Check(
                name=f"CRD {crd}",
                ok=present,
                detail="installed" if present else "missing",
                fix="" if present else fix,
            )
        )

    ns_ok = cluster.namespace_exists(namespace)
    checks.append(
        Check(
            name="Namespace",
            ok=ns_ok,
            detail=f"{namespace} {'exists' if ns_ok else 'not found'}",
            fix=""
            if ns_ok
            else f"kubectl create namespace {namespace} (or helm --create-namespace)",
        )
    )
    secret = values["model"].get("hfTokenSecret", {})
    if secret.get("name"):
        keys = cluster.secret_keys(namespace, secret["name"])
        ok = keys is not None and secret.get("key", "token") in keys
        detail = f"Secret {namespace}/{secret['name']} " + (
            "not found" if keys is None else f"has keys {sorted(keys)}"
        )
        checks.append(
            Check(
                name="HF token Secret",
                ok=ok,
                detail=detail,
                fix=""
                if ok
                else f"kubectl -n {namespace} create secret generic {secret['name']} "
                f"--from-literal={secret.get('key', 'token')}=<your token>",
            )
        )
    return checks


def report(checks: list[Check], fmt: str) -> int:
    if fmt == "json":
        print(json.dumps([c.model_dump() for c in checks], indent=2))
    else:
        for check in checks:
            mark = "ok  " if check.ok else "FAIL"
            print(f"[{mark}] {check.name}: {check.detail}")
            if check.fix:
                print(f"       fix: {check.fix}")
    failed = [c for c in checks if not c.ok]
    if fmt == "text":
        print(f"\n{len(checks) - len(failed)}/{len(checks)} checks passed", file=sys.stderr)
    return 1 if failed else 0
