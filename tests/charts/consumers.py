"""What the systems that consume the chart's manifests do with them, encoded from their sources.

- kubelet (`pkg/probe/util.go` ResolveContainerPort, used by `pkg/kubelet/prober`): a named probe
  port is looked up among the probed container's own `ports` only; a number is used as is.
- KubeRay (`ray-operator/controllers/ray/common/pod.go` BuildPod, setMissingRayStartParams,
  generateRayStartCommand, convertParamMap): `ray start` always gets `--block`; with the
  annotation `ray.io/overwrite-container-cmd: "true"` the container's command is left alone and
  the generated command is only put in `$KUBERAY_GEN_RAY_START_CMD`; otherwise KubeRay replaces
  the command with `bash -c` of `<cmd> && ulimit ...; ray start ...` (or only the latter).
- Prometheus Operator: a PodMonitor endpoint's `port` names a container port of the selected pods;
  kube-prometheus-stack selects PodMonitors and PrometheusRules by its `release` label.
"""

from __future__ import annotations

from typing import Any

Manifests = dict[tuple[str, str], dict[str, Any]]
PROBES = ("startupProbe", "livenessProbe", "readinessProbe")


def pod_templates(manifests: Manifests) -> list[tuple[str, dict[str, Any]]]:
    """(where, pod template with metadata and spec) of every pod the manifests create."""
    found: list[tuple[str, dict[str, Any]]] = []
    for (kind, name), doc in manifests.items():
        if kind == "Deployment":
            found.append((f"Deployment/{name}", doc["spec"]["template"]))
        elif kind == "RayCluster":
            found.append((f"RayCluster/{name} head", doc["spec"]["headGroupSpec"]["template"]))
            for group in doc["spec"]["workerGroupSpecs"]:
                found.append((f"RayCluster/{name} {group['groupName']}", group["template"]))
        elif kind == "Pod":
            found.append((f"Pod/{name}", {"metadata": doc["metadata"], "spec": doc["spec"]}))
    return found


def probe_port_problems(where: str, spec: dict[str, Any]) -> list[str]:
    """Probes whose port the kubelet cannot resolve, or that no container of the pod serves."""
    problems = []
    served = {p["containerPort"] for c in spec["containers"] for p in c.get("ports", [])}
    for container in spec["containers"]:
        own = {p["name"]: p["containerPort"] for p in container.get("ports", []) if "name" in p}
        for kind in PROBES:
            probe = container.get(kind)
            if not probe:
                continue
            action = probe.get("httpGet") or probe.get("tcpSocket") or probe.get("grpc")
            if action is None:
                continue
            port = action["port"]
            label = f"{where} container {container['name']} {kind} port {port!r}"
            if isinstance(port, str):
                if port not in own:
                    problems.append(f"{label}: not a port name of this container {sorted(own)}")
            elif port not in served:
                problems.append(f"{label}: no container of the pod declares it")
    return problems


def kuberay_start_params(
    node_type: str, params: dict[str, str], resources: dict[str, Any]
) -> dict[str, str]:
    """setMissingRayStartParams + generateRayStartCommand's resource defaults."""
    params = dict(params)
    if node_type == "worker":
        params.setdefault("address", "HEAD_SVC:6379")
    else:
        params.setdefault("dashboard-host", "0.0.0.0")
    params.setdefault("metrics-export-port", "8080")
    params["block"] = "true"
    params.setdefault("dashboard-agent-listen-port", "52365")
    limits, requests = resources.get("limits", {}), resources.get("requests", {})
    cpu = limits.get("cpu") or requests.get("cpu")
    if cpu and "num-cpus" not in params:
        params["num-cpus"] = str(cpu)
    gpus = limits.get("nvidia.com/gpu")
    if gpus and "num-gpus" not in params:
        params["num-gpus"] = str(gpus)
    return params


def kuberay_start_command(node_type: str, params: dict[str, str]) -> str:
    """convertParamMap: sorted flags, booleans as bare switches."""
    flags = ""
    for key in sorted(params):
        value = params[key]
        if value.lower() in ("true", "false") and key not in (
            "log-color",
            "include-dashboard",
            "include-log-monitor",
        ):
            if value.lower() == "true":
                flags += f" --{key} "
        else:
            flags += f" --{key}={value} "
    return ("ray start --head" if node_type == "head" else "ray start") + flags


def kuberay_pod_command(
    template: dict[str, Any], node_type: str, params: dict[str, str]
) -> tuple[list[str], list[str], str]:
    """The Ray container's (command, args) after KubeRay's BuildPod, and the generated
    `ray start` it puts in $KUBERAY_GEN_RAY_START_CMD."""
    container = template["spec"]["containers"][0]
    start = kuberay_start_command(
        node_type, kuberay_start_params(node_type, params, container.get("resources", {}))
    )
    annotations = template.get("metadata", {}).get("annotations", {})
    command, args = list(container.get("command", [])), list(container.get("args", []))
    if annotations.get("ray.io/overwrite-container-cmd", "").lower() == "true":
        return command, args, start
    cmd = " ".join(command + args)
    if "ray start" in cmd:
        return command, args, start
    generated = f"ulimit -n ${{RAY_START_ULIMIT_OPEN_FILES:-65536}}; {start}"
    return ["/bin/bash", "-c", "--"], [f"{cmd} && {generated}" if cmd else generated], start
