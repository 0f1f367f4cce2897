"""The router image (docker/router.Dockerfile), built by images-local and run with podman the way
the chart runs it: uid 1000, read-only root filesystem, no capabilities, in front of an engine.

A scripted engine (a real HTTP server on loopback) stands in for vLLM here; the real router in
front of real CPU engines runs in tests/e2e/test_local_replicas.py.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
import uuid

import yaml
from dflash_ops.chart.values import chart_values

from tests.conftest import REPO_ROOT
from tests.docker.podman import (
    ROUTER,
    ROUTER_VERSION,
    eventually,
    free_port,
    podman,
    ready_or_exited,
)
from tests.service.fake_engine_server import FakeEngineServer


def test_one_router_version_everywhere() -> None:
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    (pinned,) = re.findall(r'"vllm-router==([^"]+)"', pyproject)
    assert pinned == ROUTER_VERSION
    assert chart_values([])["router"]["image"]["tag"] == ROUTER_VERSION


def test_router_image_is_non_root_and_labelled(images: None) -> None:
    assert podman("run", "--rm", "--entrypoint", "id", ROUTER, "-u").stdout.strip() == "1000"
    labels = json.loads(podman("image", "inspect", "--format", "{{json .Labels}}", ROUTER).stdout)
    assert labels["org.opencontainers.image.version"] == ROUTER_VERSION
    shown = podman("run", "--rm", ROUTER, "--help").stdout
    assert "--service-discovery" in shown


def test_router_image_routes_as_the_chart_runs_it(container: list[str]) -> None:
    engine = FakeEngineServer()
    name = f"dflash-router-{uuid.uuid4().hex[:8]}"
    port, metrics = free_port(), free_port()
    try:
        podman(
            "run", "-d", "--name", name, "--network=host", "--read-only", "--user", "1000:1000",
            "--cap-drop", "ALL", "--security-opt", "no-new-privileges", ROUTER,
            "--host", "127.0.0.1", "--port", str(port), "--worker-urls", engine.url,
            "--policy", "round_robin", "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(metrics), "--health-check-interval-secs", "1",
        )  # fmt: skip
        container.append(name)
        url = f"http://127.0.0.1:{port}"
        ready_or_exited(name, f"{url}/readiness", 60, "the router ready with its engine")
        request = urllib.request.Request(
            f"{url}/v1/completions",
            data=json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 1}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert json.load(reply)["choices"][0]["text"] == "!"
        page = eventually(
            lambda: (
                urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5)
                .read()
                .decode()
            ),
            20,
            "the router's metrics",
        )
        assert f'vllm_router_processed_requests_total{{worker="{engine.url}"}} 1' in page
        started = time.monotonic()
        podman("stop", "--time", "10", name)
        assert time.monotonic() - started < 5
    finally:
        engine.stop()


def test_the_chart_runs_the_image_with_the_same_constraints() -> None:
    """What the test above runs the image with is what the chart's pod spec asks for."""
    from dflash_ops.chart.helm import helm_template

    text = helm_template([], ["router.enabled=true"], "t", "llm")
    (router,) = [
        d
        for d in yaml.safe_load_all(text)
        if d and d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-router")
    ]
    pod = router["spec"]["template"]["spec"]
    # The router and the door in front of it (nginx, tests/charts/test_door.py) run alike.
    assert sorted(c["name"] for c in pod["containers"]) == ["door", "router"]
    (container,) = [c for c in pod["containers"] if c["name"] == "router"]
    assert pod["securityContext"]["runAsUser"] == 1000
    for each in pod["containers"]:
        assert each["securityContext"]["readOnlyRootFilesystem"] is True
        assert each["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert each["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["image"].startswith("ghcr.io/dflash-serve/vllm-router:")
