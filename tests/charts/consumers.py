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
- kubelet (`pkg/kubelet/kuberuntime/kuberuntime_container.go` killContainer, `pkg/kubelet/envvars`):
  the preStop hook runs first, SIGKILL follows terminationGracePeriodSeconds after the hook
  started; with enableServiceLinks (the default) every Service of the namespace becomes
  variables `NAME_PORT=tcp://IP:PORT` in every container.
- Deployment controller (`pkg/controller/deployment/progress.go`) and kstatus: no new available
  pod for progressDeadlineSeconds (default 600) is ProgressDeadlineExceeded, which kstatus, Helm
  4's `--wait` and Argo CD report as failed.
- KubeRay (`pod.go` initLivenessAndReadinessProbe, `raycluster_controller.go`
  shouldRecreatePodsForUpgrade, `utils/util.go` GenerateHashWithoutReplicasAndWorkersToDelete).
- KEDA: the HPA it creates takes `advanced.horizontalPodAutoscalerConfig.behavior`.
- NetworkPolicy (networking.k8s.io/v1): ingress is the union of the rules of every policy that
  selects the pod; a peer with only podSelector means the policy's own namespace.
- KubeRay (`pod.go` configureTokenAuth, SetContainerTokenAuthEnvVars; v1.6+): with
  `spec.authOptions.mode: token` the Ray container (the first) of every head and worker pod gets
  RAY_AUTH_MODE=token and RAY_AUTH_TOKEN from the Secret `authOptions.secretName` (else one
  named after the RayCluster, which KubeRay creates), key `auth_token`; a variable the container
  already sets is left as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
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


# -- kubelet: probes, termination, service links --------------------------------------------
# pkg/apis/core/v1/defaults.go and the kubelet's prober / kuberuntime_container.go.
PROBE_DEFAULTS = {"periodSeconds": 10, "failureThreshold": 3, "initialDelaySeconds": 0}
DEFAULT_GRACE_SECONDS = 30


def startup_budget_seconds(container: dict[str, Any]) -> int:
    """How long the kubelet lets a container start before it kills it: the startup probe's
    initialDelaySeconds + periodSeconds x failureThreshold (liveness' when there is no startup
    probe; unbounded without either)."""
    probe = container.get("startupProbe") or container.get("livenessProbe")
    if probe is None:
        return 10**9
    get = {**PROBE_DEFAULTS, **probe}.get
    return int(get("initialDelaySeconds")) + int(get("periodSeconds")) * int(
        get("failureThreshold")
    )


def prestop_seconds(container: dict[str, Any]) -> int:
    """Seconds a container's preStop hook holds it before SIGTERM (`sleep N` exec or the sleep
    action; 0 without a hook)."""
    hook = container.get("lifecycle", {}).get("preStop")
    if not hook:
        return 0
    if "sleep" in hook:
        return int(hook["sleep"]["seconds"])
    command = hook.get("exec", {}).get("command", [])
    if len(command) == 2 and command[0] == "sleep":
        return int(command[1])
    raise AssertionError(f"preStop hook of unknown duration: {hook}")


def grace_seconds(spec: dict[str, Any]) -> int:
    """The kubelet sends SIGKILL this long after it started the preStop hooks."""
    return int(spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS))


def service_link_variables(spec: dict[str, Any], services: dict[str, int]) -> dict[str, str]:
    """What the kubelet adds to every container's environment for the namespace's Services
    (enableServiceLinks defaults to true): NAME_PORT=tcp://IP:PORT and friends."""
    if spec.get("enableServiceLinks", True) is False:
        return {}
    found = {}
    for name, port in services.items():
        prefix = name.upper().replace("-", "_")
        found[f"{prefix}_SERVICE_HOST"] = "10.0.0.1"
        found[f"{prefix}_SERVICE_PORT"] = str(port)
        found[f"{prefix}_PORT"] = f"tcp://10.0.0.1:{port}"
    return found


# -- Deployment controller, kstatus, Helm --wait ---------------------------------------------
DEFAULT_PROGRESS_DEADLINE_SECONDS = 600


def progress_deadline_seconds(deployment: dict[str, Any]) -> int:
    """After this long without a new available pod the Deployment controller sets
    Progressing=False/ProgressDeadlineExceeded; kstatus reports Failed and `helm --wait` fails."""
    return int(deployment["spec"].get("progressDeadlineSeconds", DEFAULT_PROGRESS_DEADLINE_SECONDS))


def pods_kept_during_rollout(deployment: dict[str, Any], replicas: int) -> tuple[int, int]:
    """(fewest old-or-new pods that stay available, most pods at once) during a rollout."""
    strategy = deployment["spec"].get("strategy", {"type": "RollingUpdate"})
    if strategy["type"] == "Recreate":
        return 0, replicas
    rolling = strategy.get("rollingUpdate", {})

    def absolute(value: Any, round_up: bool) -> int:
        if isinstance(value, str) and value.endswith("%"):
            exact = replicas * int(value[:-1]) / 100
            return int(-(-exact // 1)) if round_up else int(exact)
        return int(value)

    surge = absolute(rolling.get("maxSurge", "25%"), round_up=True)
    unavailable = absolute(rolling.get("maxUnavailable", "25%"), round_up=False)
    return replicas - unavailable, replicas + surge


# -- KubeRay ----------------------------------------------------------------------------------


def kuberay_injected_probes(container: dict[str, Any]) -> list[str]:
    """initLivenessAndReadinessProbe: the probes KubeRay adds to a Ray container that has none
    of its own; they ask the dashboard agent (52365), which needs ray[default] and a running
    agent."""
    return [kind for kind in ("livenessProbe", "readinessProbe") if container.get(kind) is None]


def kuberay_recreate_hash(spec: dict[str, Any]) -> str:
    """GenerateHashWithoutReplicasAndWorkersToDelete: with upgradeStrategy Recreate, KubeRay
    recreates every pod when this hash of the RayCluster spec changes; replicas, tolerations,
    scheduling gates and the strategy itself are left out."""
    import copy
    import hashlib
    import json

    muted = copy.deepcopy(spec)
    muted["headGroupSpec"]["template"]["spec"].pop("tolerations", None)
    muted["headGroupSpec"]["template"]["spec"].pop("schedulingGates", None)
    for group in muted.get("workerGroupSpecs", []):
        for key in ("replicas", "minReplicas", "maxReplicas"):
            group.pop(key, None)
        group.get("scaleStrategy", {}).pop("workersToDelete", None)
        group["template"]["spec"].pop("tolerations", None)
        group["template"]["spec"].pop("schedulingGates", None)
    muted.pop("upgradeStrategy", None)
    return hashlib.sha256(json.dumps(muted, sort_keys=True).encode()).hexdigest()


# -- KEDA ---------------------------------------------------------------------------------------
HPA_DEFAULT_SCALE_DOWN_WINDOW = 300


def hpa_scale_down_window(behavior: dict[str, Any] | None) -> int:
    """The HPA controller's scale-down stabilization (300 s when behavior leaves it out)."""
    down = (behavior or {}).get("scaleDown", {})
    return int(down.get("stabilizationWindowSeconds", HPA_DEFAULT_SCALE_DOWN_WINDOW))


def keda_hpa_behavior(scaled_object: dict[str, Any]) -> dict[str, Any] | None:
    """The behavior of the HPA KEDA creates: advanced.horizontalPodAutoscalerConfig.behavior
    (cooldownPeriod only governs scaling to and from zero)."""
    advanced = scaled_object["spec"].get("advanced", {})
    behavior = advanced.get("horizontalPodAutoscalerConfig", {}).get("behavior")
    return behavior


# -- NetworkPolicy (networking.k8s.io/v1 semantics) -----------------------------------------


def selector_matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    if selector is None:
        return False
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


@dataclass(frozen=True)
class Peer:
    """A pod that opens a connection: its namespace, the namespace's labels and its labels."""

    namespace: str
    namespace_labels: dict[str, str]
    labels: dict[str, str]


def ingress_allowed(
    policies: list[dict[str, Any]],
    source: Peer,
    target_namespace: str,
    target_labels: dict[str, str],
    target_ports: dict[str, int],
    port: int,
) -> bool:
    """Whether the NetworkPolicies let `source` connect to `port` (TCP) of the target pod.
    A pod no Ingress policy selects takes everything; otherwise one rule of one selecting policy
    must match both the peer and the port (named ports resolve on the target's containers)."""
    selecting = [
        p
        for p in policies
        if p["metadata"].get("namespace", target_namespace) == target_namespace
        and selector_matches(p["spec"]["podSelector"], target_labels)
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
    ]
    if not selecting:
        return True
    for policy in selecting:
        namespace = policy["metadata"].get("namespace", target_namespace)
        for rule in policy["spec"].get("ingress", []):
            peers = rule.get("from")
            ports = rule.get("ports")
            if ports is not None and not any(
                (target_ports.get(p["port"]) if isinstance(p["port"], str) else p["port"]) == port
                or (
                    isinstance(p["port"], int)
                    and "endPort" in p
                    and p["port"] <= port <= p["endPort"]
                )
                for p in ports
                if p.get("protocol", "TCP") == "TCP"
            ):
                continue
            if peers is None or any(_peer_matches(peer, source, namespace) for peer in peers):
                return True
    return False


def _peer_matches(peer: dict[str, Any], source: Peer, policy_namespace: str) -> bool:
    pods, namespaces = peer.get("podSelector"), peer.get("namespaceSelector")
    if namespaces is None and pods is None:
        return False  # ipBlock: not for pod traffic here
    if namespaces is None:
        in_namespace = source.namespace == policy_namespace
    else:
        in_namespace = selector_matches(namespaces, source.namespace_labels)
    return in_namespace and (pods is None or selector_matches(pods, source.labels))


def kuberay_token_env(cluster: dict[str, Any], template: dict[str, Any]) -> dict[str, Any]:
    """The Ray container's Ray-auth variables after KubeRay built the pod (name -> value or
    valueFrom), with those the chart set itself winning as they do in KubeRay."""
    container = template["spec"]["containers"][0]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}
    auth = cluster["spec"].get("authOptions") or {}
    if auth.get("mode", "token") != "token" or not auth:
        return {k: v for k, v in env.items() if k.startswith("RAY_AUTH")}
    env.setdefault("RAY_AUTH_MODE", "token")
    secret = auth.get("secretName") or cluster["metadata"]["name"]
    env.setdefault("RAY_AUTH_TOKEN", {"secretKeyRef": {"name": secret, "key": "auth_token"}})
    return {k: v for k, v in env.items() if k.startswith("RAY_AUTH")}
