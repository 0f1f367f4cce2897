"""Contract suite: every render checked against what its consumers do with it.

Not a restatement of the templates: each check encodes a rule of the kubelet, KubeRay, the
Prometheus Operator or the user following the README, and fails on a chart that renders
something those systems cannot use (a probe port the kubelet cannot resolve, a command after a
blocking `ray start`, a cache path nobody mounted, a Secret nobody creates, a selector an
upgrade would have to change).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from itertools import pairwise, permutations
from pathlib import Path
from typing import Any

import pytest
import yaml
from dflash_ops.paths import CHART_DIR, PROFILES_DIR

from tests.charts.conftest import PROFILES, render_docs
from tests.charts.consumers import (
    Manifests,
    kuberay_pod_command,
    pod_templates,
    probe_port_problems,
)
from tests.conftest import REPO_ROOT


def containers(template: dict[str, Any]) -> list[dict[str, Any]]:
    spec = template["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


# -- kubelet --------------------------------------------------------------------------------


def test_every_probe_port_resolves_in_its_own_container(renders: dict[str, Manifests]) -> None:
    problems = [
        f"{render}: {problem}"
        for render, manifests in renders.items()
        for where, template in pod_templates(manifests)
        for problem in probe_port_problems(where, template["spec"])
    ]
    assert not problems, "\n".join(problems)


def test_every_path_in_the_environment_is_on_a_writable_mount(
    renders: dict[str, Manifests],
) -> None:
    problems = []
    for render, manifests in renders.items():
        for where, template in pod_templates(manifests):
            for container in containers(template):
                mounts = [
                    m["mountPath"]
                    for m in container.get("volumeMounts", [])
                    if not m.get("readOnly", False)
                ]
                for env in container.get("env", []):
                    value = env.get("value") or ""
                    if not value.startswith("/"):
                        continue
                    if not any(value == m or value.startswith(m.rstrip("/") + "/") for m in mounts):
                        problems.append(
                            f"{render}: {where} {container['name']} {env['name']}={value} "
                            f"is on no writable mount ({mounts})"
                        )
    assert not problems, "\n".join(problems)


def test_named_ports_of_services_policies_and_monitors_exist_on_their_pods(
    renders: dict[str, Manifests],
) -> None:
    problems = []
    for render, manifests in renders.items():
        pods = pod_templates(manifests)

        def port_names(
            selector: dict[str, str], pods: list[tuple[str, dict[str, Any]]] = pods
        ) -> set[str]:
            names: set[str] = set()
            for _, template in pods:
                labels = template["metadata"].get("labels", {})
                if all(labels.get(k) == v for k, v in selector.items()):
                    names |= {p["name"] for c in containers(template) for p in c.get("ports", [])}
            return names

        for (kind, name), doc in manifests.items():
            if kind == "Service":
                names = port_names(doc["spec"]["selector"])
                wanted = [p["targetPort"] for p in doc["spec"]["ports"]]
            elif kind == "PodMonitor":
                names = port_names(doc["spec"]["selector"]["matchLabels"])
                wanted = [e["port"] for e in doc["spec"]["podMetricsEndpoints"]]
            elif kind == "NetworkPolicy":
                names = port_names(doc["spec"]["podSelector"].get("matchLabels", {}))
                wanted = [
                    p["port"] for rule in doc["spec"]["ingress"] for p in rule.get("ports", [])
                ]
            else:
                continue
            if not names:
                problems.append(f"{render}: {kind}/{name} selects no pod")
            problems += [
                f"{render}: {kind}/{name} port {port!r} is no container port name {sorted(names)}"
                for port in wanted
                if isinstance(port, str) and port not in names
            ]
    assert not problems, "\n".join(problems)


# -- KubeRay --------------------------------------------------------------------------------


STUB_RAY = """#!/bin/bash
echo "ray $*" >> "$RECORD"
case " $* " in *" --block "*) exec sleep 600 ;; esac
"""
STUB_PYTHON = """#!/bin/bash
echo "python3 $*" >> "$RECORD"
"""
STUB_VLLM = """#!/bin/bash
echo "vllm $*" >> "$RECORD"
"""


def run_ray_container(
    manifests: Manifests, node: str, tmp_path: Path
) -> tuple[subprocess.CompletedProcess[str] | None, list[str], str]:
    """Run a Ray container as KubeRay would start it, with stub `ray` (blocks forever on
    --block, like the real one), `python3` and `vllm`; the ConfigMaps mounted from the render."""
    cluster = next(d for (k, _), d in manifests.items() if k == "RayCluster")
    if node == "head":
        group = cluster["spec"]["headGroupSpec"]
    else:
        group = cluster["spec"]["workerGroupSpecs"][0]
    template = group["template"]
    command, args, start = kuberay_pod_command(template, node, group.get("rayStartParams", {}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("ray", STUB_RAY), ("python3", STUB_PYTHON), ("vllm", STUB_VLLM)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    container = template["spec"]["containers"][0]
    volumes = {v["name"]: v for v in template["spec"].get("volumes", [])}
    rewrite: dict[str, str] = {}
    for mount in container.get("volumeMounts", []):
        source = volumes[mount["name"]].get("configMap")
        if source is None:
            continue
        local = tmp_path / "mounts" / mount["name"]
        local.mkdir(parents=True)
        for key, text in manifests[("ConfigMap", source["name"])]["data"].items():
            (local / key).write_text(text)
        rewrite[mount["mountPath"]] = str(local)
    argv = [*command, *args]
    for target, local in rewrite.items():
        argv = [a.replace(target, local) for a in argv]
    record = tmp_path / "record"
    record.touch()
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "RECORD": str(record),
        "KUBERAY_GEN_RAY_START_CMD": start,
        **{e["name"]: e["value"] for e in container.get("env", []) if "value" in e},
    }
    # Ends when the container exits, or as soon as it reaches a blocking `ray start --block`
    # (the stub then sleeps for good: the container would never get further).
    process = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    result: subprocess.CompletedProcess[str] | None = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            stdout, stderr = process.communicate()
            result = subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)
            break
        calls = record.read_text().splitlines()
        if calls and "--block" in calls[-1].split():
            break
        time.sleep(0.02)
    if result is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
    return result, record.read_text().splitlines(), start


@pytest.mark.parametrize("render", ["a100-2node-tp4-ray", "ray-data"])
def test_the_ray_head_starts_ray_without_blocking_then_execs_vllm(
    renders: dict[str, Manifests], render: str, tmp_path: Path
) -> None:
    result, calls, start = run_ray_container(renders[render], "head", tmp_path)
    assert "--block" in start  # what KubeRay generates
    assert result is not None, f"the head never got past a blocking command; calls: {calls}"
    assert result.returncode == 0, result.stdout + result.stderr
    ray_calls = [c for c in calls if c.startswith("ray ")]
    assert len(ray_calls) == 1 and "--head" in ray_calls[0] and "--block" not in ray_calls[0]
    assert calls[1].startswith("python3 ") and calls[1].endswith("wait-for-ray.py")
    head = next(d for (k, _), d in renders[render].items() if k == "RayCluster")
    engine = head["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert calls[2] == "vllm " + " ".join(engine["args"][1:])  # exec'd last, with every arg


def test_ray_workers_keep_kuberays_blocking_start(
    renders: dict[str, Manifests], tmp_path: Path
) -> None:
    result, calls, _ = run_ray_container(renders["a100-2node-tp4-ray"], "worker", tmp_path)
    assert result is None  # `ray start --block` holds the worker container, as it must
    assert len(calls) == 1 and calls[0].startswith("ray start ") and "--block" in calls[0]


def test_the_old_chained_head_command_is_caught(tmp_path: Path) -> None:
    """The check above fails on the chart's former head command (`... && exec vllm`)."""
    manifests = render_docs([PROFILES_DIR / "a100-2node-tp4-ray.yaml"], [])
    cluster = next(d for (k, _), d in manifests.items() if k == "RayCluster")
    engine = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    engine["command"] = ["/bin/bash", "-c"]
    engine["args"] = ["$KUBERAY_GEN_RAY_START_CMD && exec " + shlex.join(engine["args"])]
    result, calls, _ = run_ray_container(manifests, "head", tmp_path)
    assert result is None and not any(c.startswith("vllm") for c in calls)


# -- the README's install, and upgrades between profiles -------------------------------------


README_CHART = "oci://ghcr.io/dflash-serve/charts/dflash-serve"


def readme_install_words() -> list[str]:
    """The README's `helm install` command, as the shell splits it."""
    text = (REPO_ROOT / "README.md").read_text()
    block = text[text.index(f"helm install dflash {README_CHART}") :]
    command = block[: block.index("\n   helm test")].replace("\\\n", " ")
    return shlex.split(command, comments=True)


def readme_install() -> tuple[list[Path], list[str], set[str]]:
    """Values files, --set flags and Secrets the README's install steps create. The published
    chart is this checkout's (tests/docker/test_release.py renders one from a registry and
    compares): `helm pull --untar`'s dflash-serve/ is charts/dflash-serve/ here."""
    text = (REPO_ROOT / "README.md").read_text()
    words = readme_install_words()
    assert f"helm pull {README_CHART} --version" in text and "--untar" in text
    pairs = list(pairwise(words))
    values = [CHART_DIR / w.removeprefix("dflash-serve/") for prev, w in pairs if prev == "-f"]
    sets = [w for prev, w in pairs if prev == "--set"]
    secrets = set(re.findall(r"kubectl -n \S+ create secret generic (\S+)", text))
    return values, sets, secrets


def referenced_objects(manifests: Manifests) -> set[tuple[str, str]]:
    refs: set[tuple[str, str]] = set()
    for _, template in pod_templates(manifests):
        spec = template["spec"]
        refs |= {("Secret", s["name"]) for s in spec.get("imagePullSecrets", [])}
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                refs.add(("Secret", volume["secret"]["secretName"]))
            if "configMap" in volume:
                refs.add(("ConfigMap", volume["configMap"]["name"]))
            if "persistentVolumeClaim" in volume:
                refs.add(("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]))
        for container in containers(template):
            for env in container.get("env", []):
                source = env.get("valueFrom", {})
                if "secretKeyRef" in source:
                    refs.add(("Secret", source["secretKeyRef"]["name"]))
                if "configMapKeyRef" in source:
                    refs.add(("ConfigMap", source["configMapKeyRef"]["name"]))
    return refs


def test_the_readme_install_references_only_what_exists_and_loads_the_alerts() -> None:
    values, sets, secrets = readme_install()
    manifests = render_docs(values, sets)
    missing = [
        ref
        for ref in referenced_objects(manifests)
        if ref not in manifests and not (ref[0] == "Secret" and ref[1] in secrets)
    ]
    assert not missing, f"referenced but neither rendered nor created by the README: {missing}"
    # kube-prometheus-stack selects PodMonitors and PrometheusRules by its release label.
    for kind in ("PodMonitor", "PrometheusRule"):
        doc = next(d for (k, _), d in manifests.items() if k == kind)
        assert doc["metadata"]["labels"].get("release") == "kube-prometheus-stack", kind
    speculative = next(
        a
        for a in next(d for (k, _), d in manifests.items() if k == "Deployment")["spec"][
            "template"
        ]["spec"]["containers"][0]["args"]
        if a.startswith('{"method"')
    )
    assert '"model":"incoai/Qwen3.8-Flash-Next-DFlash2"' in speculative
    images = [c["image"] for _, template in pod_templates(manifests) for c in containers(template)]
    # Ours as the release publishes them; the door is the official nginx image the chart pins.
    door = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["door"]["image"]
    door_image = f"{door['repository']}:{door['tag']}"
    assert all(i.startswith("ghcr.io/dflash-serve/") or i == door_image for i in images), images
    assert door_image in images  # auth is on in the README's install: the door is in front


def helm_duration_seconds(text: str) -> int:
    """Go's time.ParseDuration for the h/m/s forms helm's --timeout takes."""
    units = {"h": 3600, "m": 60, "s": 1}
    parts = re.findall(r"(\d+)([hms])", text)
    assert parts and "".join(n + u for n, u in parts) == text, text
    return sum(int(n) * units[u] for n, u in parts)


def test_the_readme_install_waits_as_long_as_a_cold_start_may_take() -> None:
    """Helm's --wait fails at --timeout; the Deployment reports failure at its progress
    deadline. The README's command must wait at least that long."""
    words = readme_install_words()
    assert "--wait" in words
    timeout = helm_duration_seconds(words[words.index("--timeout") + 1])
    values, sets, _ = readme_install()
    manifests = render_docs(values, sets)
    deployment = next(d for (k, _), d in manifests.items() if k == "Deployment")
    assert timeout >= deployment["spec"]["progressDeadlineSeconds"]


IMMUTABLE = {
    "Deployment": lambda d: d["spec"]["selector"],
    "PersistentVolumeClaim": lambda d: (
        d["spec"]["accessModes"],
        d["spec"].get("storageClassName"),
    ),
    "Service": lambda d: d["spec"].get("clusterIP"),
    "PodDisruptionBudget": lambda d: d["spec"]["selector"],
}


@pytest.mark.parametrize(("old", "new"), list(permutations(PROFILES, 2)))
def test_upgrading_between_profiles_changes_no_immutable_field(
    renders: dict[str, Manifests], old: str, new: str
) -> None:
    for (kind, name), before in renders[old].items():
        after = renders[new].get((kind, name))
        if after is None or kind not in IMMUTABLE:
            continue
        assert IMMUTABLE[kind](before) == IMMUTABLE[kind](after), f"{kind}/{name}: {old} -> {new}"
