"""What preflight checks in a cluster for a rendered release: each check with what to fix."""

from __future__ import annotations

import json
import sys
from typing import Any, Protocol

from pydantic import BaseModel

from dflash_ops.preflight.release_needs import ReleaseNeeds

DEFAULT_CLASS_ANNOTATIONS = (
    "storageclass.kubernetes.io/is-default-class",
    "storageclass.beta.kubernetes.io/is-default-class",
)


class ClusterReader(Protocol):
    """The few reads preflight makes; the real one wraps the kubernetes client."""

    def nodes(self) -> list[Any]: ...
    def crd(self, name: str) -> dict[str, Any] | None: ...
    def storage_classes(self) -> list[Any]: ...
    def daemonsets(self) -> list[Any]: ...
    def namespace_exists(self, name: str) -> bool: ...
    def secret_keys(self, namespace: str, name: str) -> set[str] | None: ...


class Check(BaseModel):
    name: str
    ok: bool
    detail: str
    fix: str = ""


# What to do about a missing CRD, by API group: install the operator, or the value that drops
# the object.
CRD_FIXES = {
    "monitoring.coreos.com": (
        "install the Prometheus Operator (kube-prometheus-stack), or set "
        "monitoring.podMonitor.enabled=false and monitoring.prometheusRule.enabled=false"
    ),
    "ray.io": "install the KubeRay operator 1.6 or later (ray.io/v1 CRDs)",
    "keda.sh": "install KEDA, or set autoscaling.engine=hpa",
}


def _quantity(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def _taints(node: Any) -> list[dict[str, Any]]:
    return [
        {"key": t.key, "value": t.value or "", "effect": t.effect}
        for t in (node.spec.taints if node.spec is not None and node.spec.taints else [])
    ]


def check_gpu_nodes(needs: ReleaseNeeds, nodes: list[Any]) -> list[Check]:
    """Each GPU pod group against the nodes it may land on (its rendered node affinity,
    nodeSelector and tolerations), counting how many of its pods fit on their allocatable GPUs.
    Groups share the nodes: the Ray head and its workers are placed one after the other."""
    free = {
        (n.metadata.name, g.resource): _quantity((n.status.allocatable or {}).get(g.resource))
        for n in nodes
        for g in needs.pod_groups
    }
    checks = []
    for group in needs.pod_groups:
        fitting = [n for n in nodes if group.fits(n.metadata.labels or {}, _taints(n))]
        with_gpus = [
            n
            for n in fitting
            if _quantity((n.status.allocatable or {}).get(group.resource)) >= group.gpus
        ]
        placed = 0
        for node in fitting:
            slot = (node.metadata.name, group.resource)
            while placed < group.count and free[slot] >= group.gpus:
                free[slot] -= group.gpus
                placed += 1
        ok = placed >= group.count
        terms = (
            "; ".join(
                " and ".join(
                    f"{e['key']} {e['operator']} {e.get('values', '')}".rstrip()
                    for e in term.get("matchExpressions", [])
                )
                for term in group.node_terms
            )
            if group.node_terms
            else "any node"
        )
        checks.append(
            Check(
                name=f"GPU nodes for {group.where}",
                ok=ok,
                detail=(
                    f"{group.count} pod(s) of {group.gpus} {group.resource}; {len(fitting)} "
                    f"node(s) match ({terms}), {len(with_gpus)} of them with {group.gpus} "
                    f"allocatable; room for {placed}"
                ),
                fix=""
                if ok
                else "add GPU nodes that match, label them (GPU feature discovery sets "
                "nvidia.com/gpu.product; gpu.productAffinity=false drops that requirement), "
                "or change gpu.type / gpu.products / engine.tensorParallelSize / replicas",
            )
        )
    return checks


def check_cluster(needs: ReleaseNeeds, namespace: str, cluster: ClusterReader) -> list[Check]:
    checks: list[Check] = []
    nodes = cluster.nodes()
    checks += check_gpu_nodes(needs, nodes)

    resources = {g.resource for g in needs.pod_groups}
    plugin_sets = [
        d for d in cluster.daemonsets() if "nvidia-device-plugin" in (d.metadata.name or "")
    ]
    advertised = [
        n
        for n in nodes
        if any(_quantity((n.status.allocatable or {}).get(r)) > 0 for r in resources)
    ]
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
                + f"; {len(advertised)} node(s) advertise {', '.join(sorted(resources)) or 'GPUs'}"
            ),
            fix="" if plugin_ok else "install the NVIDIA GPU Operator or the k8s-device-plugin",
        )
    )

    classes = cluster.storage_classes()
    for claim in needs.claims:
        name = claim["metadata"]["name"]
        wanted = claim["spec"].get("storageClassName")
        modes = ", ".join(claim["spec"].get("accessModes", []))
        if wanted:
            ok = any(c.metadata.name == wanted for c in classes)
            detail = f"{name} ({modes}): StorageClass {wanted} {'exists' if ok else 'not found'}"
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
            detail = f"{name} ({modes}): default StorageClass: {', '.join(defaults) or 'none'}"
            fix = "" if ok else "mark one StorageClass as default or set modelCache.storageClass"
        checks.append(Check(name="Model cache storage", ok=ok, detail=detail, fix=fix))

    for crd_name, kind in sorted(needs.crds.items()):
        crd = cluster.crd(crd_name)
        group = crd_name.split(".", 1)[1]
        checks.append(
            Check(
                name=f"CRD {crd_name}",
                ok=crd is not None,
                detail=f"installed (for the {kind})"
                if crd is not None
                else f"missing (the release renders a {kind})",
                fix=""
                if crd is not None
                else CRD_FIXES.get(group, f"install the operator that serves {group}"),
            )
        )
        if kind == "RayCluster" and crd is not None:
            checks.append(check_kuberay_upgrades(crd))
            checks.append(check_kuberay_auth(crd))

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
    seen: set[tuple[str, str | None]] = set()
    for ref in needs.secrets:
        if (ref.name, ref.key) in seen or ("Secret", ref.name) in needs.rendered:
            continue
        seen.add((ref.name, ref.key))
        keys = cluster.secret_keys(namespace, ref.name) if ns_ok else None
        ok = keys is not None and (ref.key is None or ref.key in keys)
        what = f"Secret {namespace}/{ref.name}" + (f" key {ref.key}" if ref.key else "")
        state = "not found" if keys is None else f"has keys {sorted(keys)}"
        literal = f" --from-literal={ref.key}=<value>" if ref.key else ""
        checks.append(
            Check(
                name=f"Secret {ref.name}",
                ok=ok,
                detail=f"{what} (used by {ref.used_by}): {state}",
                fix=""
                if ok
                else f"kubectl -n {namespace} create secret generic {ref.name}{literal}, or "
                "point the value naming it (model.hfTokenSecret, auth.apiKeySecret) elsewhere",
            )
        )
    return checks


def _kuberay_field(crd: dict[str, Any], name: str, field: str, what: str, lacking: str) -> Check:
    """A served version of the RayCluster CRD has spec.<field>: an operator without it prunes
    the field, and `lacking` is what then happens."""
    knows = False
    for version in crd.get("spec", {}).get("versions", []):
        schema = version.get("schema", {}).get("openAPIV3Schema", {})
        spec = schema.get("properties", {}).get("spec", {})
        if field in spec.get("properties", {}):
            knows = True
    return Check(
        name=name,
        ok=knows,
        detail=f"RayCluster CRD has spec.{field} ({what})"
        if knows
        else f"RayCluster CRD has no spec.{field} (an operator older than {what}): {lacking}",
        fix="" if knows else "upgrade the KubeRay operator and its CRDs to 1.6 or later",
    )


def check_kuberay_auth(crd: dict[str, Any]) -> Check:
    """KubeRay >= 1.5.1 knows spec.authOptions (secretName from 1.6)."""
    return _kuberay_field(
        crd, "KubeRay Ray authentication", "authOptions", "KubeRay 1.5.1",
        "Ray would run without its token (distributed.rayAuth), whoever reaches its ports "
        "running code in the head pod",
    )  # fmt: skip


def check_kuberay_upgrades(crd: dict[str, Any]) -> Check:
    """KubeRay >= 1.6 knows spec.upgradeStrategy."""
    return _kuberay_field(
        crd, "KubeRay upgrades", "upgradeStrategy", "KubeRay 1.6",
        "a helm upgrade would never replace the running Ray pods",
    )  # fmt: skip


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
