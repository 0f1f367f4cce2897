"""The images built and run for real with podman (ops/setup/images-local.sh; no registry).

The sidecar image: non-root, small and without the benchmark's or Kubernetes' libraries,
/livez and /readyz (503 without an engine, 200 beside the real CPU engine), a HEALTHCHECK that
follows --port, and a stop in under a second. The engine image, built on a stand-in base with
the exact vllm==0.33.0 wheel: the patch step and self check inside the build, the patched
package in the image, and a clear failure on a base without vLLM. The CPU image is opt-in
(`pytest --heavy-images`): a 4 GB build that starts the whole local stack.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
import uuid

import pytest

from tests.conftest import REPO_ROOT
from tests.docker.podman import (
    CONTAINERS_CONF,
    CPU,
    ENGINE,
    PYTHON_BASE,
    SIDECAR,
    TAG,
    build,
    eventually,
    free_port,
    get,
    podman,
    ready_or_exited,
    run_sidecar,
)


def test_sidecar_runs_non_root_and_small(images: None) -> None:
    assert podman("run", "--rm", "--entrypoint", "id", SIDECAR, "-u").stdout.strip() == "1000"
    probe = (
        "import importlib.util as u; "
        "print([m for m in ('matplotlib', 'numpy', 'kubernetes', 'aiohttp', 'torch') "
        "if u.find_spec(m)])"
    )
    assert (
        podman("run", "--rm", "--entrypoint", "python", SIDECAR, "-c", probe).stdout.strip() == "[]"
    )
    sizes = {
        image: int(podman("image", "inspect", "--format", "{{.Size}}", image).stdout)
        for image in (SIDECAR, PYTHON_BASE)
    }
    added_mb = (sizes[SIDECAR] - sizes[PYTHON_BASE]) / 1e6
    # python:3.11.11-slim-bookworm is about 130 MB unpacked, so this keeps the real image under
    # the 150 MB goal (the stand-in base here is bigger; only the sidecar's own layers count).
    assert added_mb < 19, f"the sidecar adds {added_mb:.1f} MB to its base"
    labels = json.loads(podman("image", "inspect", "--format", "{{json .Labels}}", SIDECAR).stdout)
    assert labels["org.opencontainers.image.version"] == TAG
    assert labels["io.dflash-serve.extras"] == ""


def test_sidecar_without_an_engine_is_alive_not_ready(container: list[str]) -> None:
    _, url = run_sidecar(container)
    status, body = eventually(
        lambda: (r := get(f"{url}/readyz"))[1].get("state") and r, 30, "a readiness answer"
    )
    assert status == 503 and body["ready"] is False
    assert body["reason"].startswith("engine loading: no answer from /health yet")


def test_healthcheck_follows_the_port_and_sigterm_stops_at_once(container: list[str]) -> None:
    (image,) = json.loads(podman("image", "inspect", SIDECAR).stdout)
    assert image["Healthcheck"]["Test"] == [
        "CMD",
        "python",
        "-m",
        "dflash_sidecar.healthcheck",
    ]  # kept: the image is built in the Docker format
    name, url = run_sidecar(container)
    port = url.rsplit(":", 1)[1]
    assert port != "9100"
    check = podman("exec", name, "python", "-m", "dflash_sidecar.healthcheck", check=False)
    assert check.returncode == 0, check.stderr
    # A container of its own network (nothing else on the machine can answer its check): no
    # sidecar as PID 1 there, so the check fails, as it must.
    other = subprocess.run(
        ["podman", "run", "--rm", "--network=none", "--entrypoint", "python", SIDECAR, "-m",
         "dflash_sidecar.healthcheck"],
        capture_output=True, text=True, env=os.environ | {"CONTAINERS_CONF": str(CONTAINERS_CONF)},
    )  # fmt: skip
    assert other.returncode != 0
    started = time.monotonic()
    podman("stop", "--time", "10", name)
    # The sidecar ends on SIGTERM: exit 0 (podman's SIGKILL after the 10 s grace gives 137),
    # well inside the grace; not a time this test controls to the tenth (1.02 s under load).
    assert time.monotonic() - started < 8.0
    state = json.loads(podman("inspect", "--format", "{{json .State}}", name).stdout)
    assert state["ExitCode"] == 0, state


def test_engine_image_is_patched_and_self_checks(images: None) -> None:
    check = podman(
        "run", "--rm", "--entrypoint", "dflash-serve", ENGINE, "patches", "check",
        "--require-applied", "--series-dir", "/opt/dflash-serve/patches",
    )  # fmt: skip
    manifest = json.loads((REPO_ROOT / "patches" / "manifest.json").read_text())
    assert check.stdout.count(": applied") == len(manifest["patches"]) == 4
    pin = (REPO_ROOT / "docker" / "ray-version.txt").read_text().strip()
    selfcheck = podman(
        "run", "--rm", "-e", f"DFLASH_EXPECT_RAY={pin}", "--entrypoint", "python3", ENGINE,
        "/opt/dflash-serve/docker/selfcheck.py",
    )  # fmt: skip
    assert "self check passed" in selfcheck.stdout
    # The Ray the chart's RayCluster names, with ray[default]'s dashboard agent.
    assert f"ray {pin} with the dashboard" in selfcheck.stdout
    config = json.loads(podman("image", "inspect", "--format", "{{json .Config}}", ENGINE).stdout)
    assert config["Entrypoint"] == ["vllm", "serve"]
    manifest = json.loads((REPO_ROOT / "patches" / "manifest.json").read_text())
    series = hashlib.sha256("".join(p["sha256"] for p in manifest["patches"]).encode()).hexdigest()
    assert config["Labels"]["io.dflash-serve.patch-series.sha256"] == series


def test_engine_image_on_a_base_without_vllm_fails_with_the_reason(images: None) -> None:
    tag = f"localhost/dflash-serve/wrong-base:{uuid.uuid4().hex[:8]}"
    result = subprocess.run(
        ["podman", "build", "--format", "docker", "--pull=never", "--build-arg",
         f"VLLM_BASE_IMAGE={PYTHON_BASE}", "-f", "docker/vllm.Dockerfile", "-t", tag, "."],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=600,
        env=os.environ | {"CONTAINERS_CONF": str(CONTAINERS_CONF)},
    )  # fmt: skip
    podman("rmi", "-f", tag, check=False)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "this image has no vllm package; the dflash-serve patch series needs vllm==0.33.0" in (
        output
    )
    assert "Traceback" not in output


@pytest.mark.heavy_images
def test_cpu_image_brings_the_local_stack_up(container: list[str]) -> None:
    build("cpu")
    ports = {k: free_port() for k in ("engine", "sidecar", "prometheus")}
    flags = [
        "--engine-port", str(ports["engine"]), "--sidecar-port", str(ports["sidecar"]),
        "--prometheus-port", str(ports["prometheus"]),
    ]  # fmt: skip
    # A container's default 64 MiB /dev/shm is too little for vLLM's worker process and its ring:
    # asked for (VLLM_ENABLE_V1_MULTIPROCESSING=1), refused at once, naming the flag.
    small = podman(
        "run", "--rm", "--network=host", "-e", "VLLM_ENABLE_V1_MULTIPROCESSING=1", CPU, *flags,
        check=False, timeout=120,
    )  # fmt: skip
    assert small.returncode == 2
    assert "--shm-size=1g" in small.stderr and "Traceback" not in small.stderr
    # The stack's own layout (the engine core runs the model) starts in the default /dev/shm.
    name = f"dflash-cpu-{uuid.uuid4().hex[:8]}"
    podman("run", "-d", "--name", name, "--network=host", CPU, *flags)
    container.append(name)
    url = f"http://127.0.0.1:{ports['sidecar']}"
    ready_or_exited(name, f"{url}/readyz", 600, "the CPU image's stack ready")
    assert podman("exec", name, "id", "-u").stdout.strip() == "1000"
