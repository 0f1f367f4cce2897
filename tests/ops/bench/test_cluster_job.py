"""`dflash-serve bench job`: the Job judged by what Kubernetes does with it (the release's
Service and NetworkPolicy as the chart renders them, the CPU image's user), and its containers'
commands run in the order the kubelet runs them, against a real server."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.charts.conftest import render
from tests.charts.consumers import Peer, ingress_allowed, selector_matches
from tests.conftest import REPO_ROOT

NAMESPACE_LABELS = {"kubernetes.io/metadata.name": "llm"}


def job(*flags: str) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    done = subprocess.run(
        [sys.executable, "-m", "dflash_ops.cli", "bench", "job", *flags],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout), done


def pod_spec(manifest: dict[str, Any]) -> dict[str, Any]:
    return manifest["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def test_the_job_reaches_the_release_service_and_is_never_its_endpoint() -> None:
    manifest, done = job("--release", "dflash", "--namespace", "llm", "--", "--concurrency", "1,4")
    manifests = render("networkPolicy.enabled=true", release="dflash")
    services = [m for (kind, _), m in manifests.items() if kind == "Service"]
    bench = pod_spec(manifest)["initContainers"][0]
    url = bench["args"][bench["args"].index("--base-url") + 1]
    host, port = re.fullmatch(r"http://([a-z0-9-]+):(\d+)", url).groups()  # type: ignore[union-attr]
    # kube-dns resolves a bare Service name in the pod's namespace: the release's API Service.
    service = next(s for s in services if s["metadata"]["name"] == host)
    assert int(port) in [p["port"] for p in service["spec"]["ports"]]
    assert manifest["metadata"]["namespace"] == "llm"
    labels = manifest["spec"]["template"]["metadata"]["labels"]
    # The bench pod must not become an endpoint of any of the release's Services.
    for s in services:
        assert not selector_matches({"matchLabels": s["spec"].get("selector", {})}, labels)
    # The NetworkPolicy lets it in.
    deployment = next(m for (kind, _), m in manifests.items() if kind == "Deployment")
    engine = deployment["spec"]["template"]
    ports = {
        p["name"]: p["containerPort"]
        for c in engine["spec"]["containers"]
        for p in c.get("ports", [])
        if "name" in p
    }
    policies = [m for (kind, _), m in manifests.items() if kind == "NetworkPolicy"]
    assert policies
    source = Peer("llm", NAMESPACE_LABELS, labels)
    assert ingress_allowed(policies, source, "llm", engine["metadata"]["labels"], ports, int(port))
    assert "kubectl logs job/dflash-dflash-serve-bench -c results" in done.stderr


def test_the_pod_runs_as_the_cpu_image_user_with_the_key_from_the_chart_secret() -> None:
    manifest, _ = job("--api-key-secret", "vllm-api-key/key")
    spec = pod_spec(manifest)
    dockerfile = (REPO_ROOT / "docker" / "cpu.Dockerfile").read_text()
    uid = int(re.search(r"^USER (\d+)", dockerfile, re.M).group(1))  # type: ignore[union-attr]
    volumes = {v["name"] for v in spec["volumes"]}
    for container in spec["initContainers"] + spec["containers"]:
        assert container["securityContext"]["runAsUser"] == uid
        assert {m["name"] for m in container["volumeMounts"]} <= volumes
    assert spec["securityContext"]["fsGroup"] == uid  # the emptyDir is writable by it
    assert spec["restartPolicy"] == "Never" and manifest["spec"]["backoffLimit"] == 0
    env = {e["name"]: e for e in spec["initContainers"][0]["env"]}
    ref = env["OPENAI_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "vllm-api-key", "key": "key"}
    # The chart's own auth value names the Secret the same way.
    auth = render("auth.apiKeySecret.name=vllm-api-key", "auth.apiKeySecret.key=key")
    rendered = json.dumps(list(auth.values()))
    assert '"secretKeyRef": {"name": "vllm-api-key", "key": "key"}' in rendered


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--", "--out", "x"], "bench job sets --out itself"),
        (["--", "--base-url=http://x:1"], "bench job sets --base-url itself"),
        (["--api-key-secret", "nokey"], "expected NAME/KEY"),
        (["--release", "Bad_Name"], "expected lowercase letters"),
    ],
)
def test_refusals(flags: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dflash_ops.cli", "bench", "job", *flags],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 2 and message in done.stderr


def run_container(container: dict[str, Any], results: Path) -> subprocess.CompletedProcess[str]:
    """The container's command and args as the kubelet execs them, with the emptyDir at
    `results` and the project's dflash-serve on PATH (the CPU image's)."""
    mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "results")
    argv = [
        re.sub(re.escape(mount) + r"(?=[/\s\"']|$)", str(results), part)
        for part in container["command"] + container.get("args", [])
    ]
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)


def test_the_containers_in_kubelet_order_fetch_results_and_fail_as_the_bench_did(
    instant_server: str, tmp_path: Path
) -> None:
    flags = ["--concurrency", "2", "--num-prompts", "4", "--repeats", "1", "--warmup", "0"]
    manifest, _ = job("--base-url", instant_server, "--", *flags)
    spec = pod_spec(manifest)
    results = tmp_path / "results"
    results.mkdir()
    init = run_container(spec["initContainers"][0], results)
    assert init.returncode == 0 and "concurrency 2" in init.stdout
    printed = {c["name"]: run_container(c, results) for c in spec["containers"]}
    assert printed["results"].returncode == 0
    fetched = json.loads(printed["results"].stdout)  # kubectl logs -c results > results.json
    assert fetched["status"] == "complete" and fetched["levels"][0]["concurrency"] == 2
    assert len(printed["requests"].stdout.splitlines()) == 4
    # A benchmark that fails: the init container still lets the pod go on, the results
    # container says so and exits as the benchmark did, so the Job is Failed.
    manifest, _ = job("--base-url", "http://127.0.0.1:9", "--", *flags)
    spec = pod_spec(manifest)
    failed = tmp_path / "failed"
    failed.mkdir()
    assert run_container(spec["initContainers"][0], failed).returncode == 0
    outcome = run_container(spec["containers"][0], failed)
    assert outcome.returncode == 2 and "no results.json" in outcome.stderr
