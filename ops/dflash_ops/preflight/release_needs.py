"""What a rendered release asks of a cluster, read from the manifests `helm install` would send:
the GPU pods and where they may land, the Secrets and claims they mount, the CRDs their kinds
need. Preflight checks these, so it checks the same values as the install (profiles, -f, --set).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

# API groups every cluster serves; any other group is a CRD somebody has to install.
BUILT_IN_GROUPS = {
    "",
    "apps",
    "batch",
    "policy",
    "autoscaling",
    "networking.k8s.io",
    "rbac.authorization.k8s.io",
    "coordination.k8s.io",
}


@dataclass(frozen=True)
class PodGroup:
    """Identical pods of the release that each need GPUs."""

    where: str
    count: int
    gpus: int
    resource: str
    node_selector: dict[str, str]
    node_terms: list[dict[str, Any]] | None  # required node affinity (ORed terms)
    tolerations: list[dict[str, Any]]

    def fits(self, labels: dict[str, str], taints: list[dict[str, Any]]) -> bool:
        """The scheduler's node filter for these pods: nodeSelector, required node affinity
        and NoSchedule/NoExecute taints (allocatable GPUs are counted by the caller)."""
        if any(labels.get(k) != v for k, v in self.node_selector.items()):
            return False
        if self.node_terms is not None and not any(
            all(_expression_holds(e, labels) for e in term.get("matchExpressions", []))
            for term in self.node_terms
        ):
            return False
        return all(
            any(_tolerates(t, taint) for t in self.tolerations)
            for taint in taints
            if taint.get("effect") in ("NoSchedule", "NoExecute")
        )


@dataclass(frozen=True)
class SecretRef:
    name: str
    key: str | None  # None: the whole Secret (a volume)
    used_by: str


@dataclass
class ReleaseNeeds:
    pod_groups: list[PodGroup] = field(default_factory=list)
    secrets: list[SecretRef] = field(default_factory=list)
    claims: list[dict[str, Any]] = field(default_factory=list)  # rendered PVCs
    crds: dict[str, str] = field(default_factory=dict)  # CRD name -> kind
    rendered: set[tuple[str, str]] = field(default_factory=set)  # (kind, name)

    @property
    def ray(self) -> bool:
        return any(kind == "RayCluster" for kind, _ in self.rendered)


def _expression_holds(expr: dict[str, Any], labels: dict[str, str]) -> bool:
    key, op, values = expr["key"], expr["operator"], expr.get("values", [])
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt"):
        try:
            number, bound = int(labels[key]), int(values[0])
        except (KeyError, ValueError, IndexError):
            return False
        return number > bound if op == "Gt" else number < bound
    return False


def _tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint.get("key")
    return toleration.get("key") == taint.get("key") and toleration.get("value", "") == taint.get(
        "value", ""
    )


def _pod_group(where: str, count: int, spec: dict[str, Any]) -> PodGroup | None:
    gpus, resource = 0, ""
    for container in spec.get("containers", []):
        for name, amount in container.get("resources", {}).get("limits", {}).items():
            if name.endswith("/gpu"):
                gpus, resource = gpus + int(amount), name
    if not gpus:
        return None
    required = (
        spec.get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    return PodGroup(
        where=where,
        count=count,
        gpus=gpus,
        resource=resource,
        node_selector=dict(spec.get("nodeSelector", {})),
        node_terms=list(required["nodeSelectorTerms"]) if required else None,
        tolerations=list(spec.get("tolerations", [])),
    )


def _secret_refs(where: str, spec: dict[str, Any]) -> list[SecretRef]:
    refs = [
        SecretRef(v["secret"]["secretName"], None, where)
        for v in spec.get("volumes", [])
        if "secret" in v and not v["secret"].get("optional")
    ]
    for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        for env in container.get("env", []):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref and not ref.get("optional"):
                refs.append(SecretRef(ref["name"], ref["key"], f"{where} {container['name']}"))
        for source in container.get("envFrom", []):
            ref = source.get("secretRef")
            if ref and not ref.get("optional"):
                refs.append(SecretRef(ref["name"], None, f"{where} {container['name']}"))
    return refs


def needs_from_render(text: str) -> ReleaseNeeds:
    needs = ReleaseNeeds()
    docs = [d for d in yaml.safe_load_all(text) if d]
    # An autoscaled Deployment starts at its scaler's minimum (the scaler owns spec.replicas).
    scaled_min = {}
    for doc in docs:
        if doc["kind"] == "ScaledObject":
            spec = doc["spec"]
            scaled_min[spec["scaleTargetRef"]["name"]] = int(spec.get("minReplicaCount", 0))
        elif doc["kind"] == "HorizontalPodAutoscaler":
            spec = doc["spec"]
            scaled_min[spec["scaleTargetRef"]["name"]] = int(spec.get("minReplicas", 1))
    for doc in docs:
        kind, name = doc["kind"], doc["metadata"]["name"]
        needs.rendered.add((kind, name))
        group = doc["apiVersion"].rpartition("/")[0]
        if group not in BUILT_IN_GROUPS:
            needs.crds[f"{kind.lower()}s.{group}"] = kind
        pods: list[tuple[str, int, dict[str, Any]]] = []
        if kind == "Deployment":
            replicas = scaled_min.get(name, int(doc["spec"].get("replicas", 1)))
            pods.append((f"Deployment/{name}", replicas, doc["spec"]["template"]["spec"]))
        elif kind == "RayCluster":
            head = doc["spec"]["headGroupSpec"]["template"]["spec"]
            pods.append((f"RayCluster/{name} head", 1, head))
            for workers in doc["spec"].get("workerGroupSpecs", []):
                pods.append(
                    (
                        f"RayCluster/{name} {workers['groupName']}",
                        int(workers.get("replicas", 1)),
                        workers["template"]["spec"],
                    )
                )
        elif kind == "Pod":
            pods.append((f"Pod/{name}", 1, doc["spec"]))
        elif kind == "PersistentVolumeClaim":
            needs.claims.append(doc)
        for where, count, spec in pods:
            pod_group = _pod_group(where, count, spec)
            if pod_group is not None:
                needs.pod_groups.append(pod_group)
            needs.secrets += _secret_refs(where, spec)
    return needs
