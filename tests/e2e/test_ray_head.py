"""The chart's Ray head start-up, run for real: a Ray head and a worker node on this machine,
the head container's script exactly as the chart renders it, and vLLM's Ray executor with
tensor parallelism 2 across the two nodes (the vLLM CPU engine, one "GPU" per node through a
test-only platform plugin: tests/e2e/ray_cpu_platform).

The script must start Ray without KubeRay's `--block`, hold vLLM back until both nodes joined,
then serve; when the worker dies, vLLM on the head must notice and exit (the container restarts).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from dflash_ops.chart.helm import helm_template
from dflash_ops.loopback import free_port
from dflash_ops.paths import PROFILES_DIR

from tests.charts.consumers import kuberay_start_command, kuberay_start_params
from tests.conftest import REPO_ROOT
from tests.e2e.ray_cpu_platform import install_metadata

pytestmark = pytest.mark.e2e

HEAD_IP, WORKER_IP = "127.0.0.3", "127.0.0.2"  # Ray rewrites 127.0.0.1 to the eth0 address


def outside_worker_ports() -> str:
    """A free port outside both raylets' worker port ranges (free_port picks below the
    ephemeral range, where those ranges are too)."""
    low = 10000 + (os.getpid() % 10) * 2000
    while True:
        port = free_port()
        if not low <= port < low + 2000:
            return str(port)


def node_ports(prefix: str) -> dict[str, str]:
    """Distinct ports for one raylet: two raylets share this host."""
    base = 10000 + (os.getpid() % 10) * 2000 + (0 if prefix == "head" else 1000)

    return {
        "node-manager-port": outside_worker_ports(),
        "object-manager-port": outside_worker_ports(),
        "runtime-env-agent-port": outside_worker_ports(),
        "dashboard-agent-grpc-port": outside_worker_ports(),
        "dashboard-agent-listen-port": outside_worker_ports(),
        "metrics-export-port": outside_worker_ports(),
        # Worker processes listen on these: below the kernel's ephemeral range (32768+), so no
        # outgoing connection of another test can hold one.
        "min-worker-port": str(base),
        "max-worker-port": str(base + 999),
    }


def failure_summary(log: str) -> str:
    """The lines that say why (errors anywhere in the log), then the log's end."""
    reasons = [line for line in log.splitlines() if "Error" in line or "error" in line]
    return "\n".join(reasons[:40]) + "\n...\n" + log[-2500:]


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return None


def session_processes(marker: str, ray_tmp: Path | None = None) -> list[int]:
    """Processes of this test's Ray session: their environment carries `marker`, or (Ray's
    agents retitle themselves over their command line and environment) they hold a file open
    under the session's temp dir."""
    pids = []
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                pids.append(int(entry.name))
                continue
            if ray_tmp is not None and any(
                os.readlink(fd).startswith(str(ray_tmp)) for fd in (entry / "fd").iterdir()
            ):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def kill_session(marker: str, ray_tmp: Path, grace_s: float = 5.0) -> None:
    """Ray's GCS and agents ignore SIGTERM for a long while: TERM, then KILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in session_processes(marker, ray_tmp):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while session_processes(marker, ray_tmp) and time.monotonic() < deadline:
            time.sleep(0.2)


@pytest.fixture(scope="module")
def rendered_head() -> dict:  # type: ignore[type-arg]
    text = helm_template([PROFILES_DIR / "a100-2node-tp4-ray.yaml"], [], "dflash", "llm")
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(text) if d}
    cluster = docs[("RayCluster", "dflash-dflash-serve")]
    scripts = docs[("ConfigMap", "dflash-dflash-serve-ray-scripts")]["data"]
    head = cluster["spec"]["headGroupSpec"]
    return {"group": head, "scripts": scripts, "rayVersion": cluster["spec"]["rayVersion"]}


@pytest.fixture()
def ray_dirs(tmp_path: Path) -> Iterator[dict[str, Path]]:
    # Ray's socket paths must stay short: its temp dir lives directly under /tmp.
    ray_tmp = Path(tempfile.mkdtemp(prefix="dfr", dir="/tmp"))
    plugin = tmp_path / "plugin"
    install_metadata(plugin)
    scripts = tmp_path / "etc-dflash-serve-ray"
    scripts.mkdir()
    marker = f"DFLASH_TEST_RAY_SESSION={ray_tmp.name}"
    yield {"ray_tmp": ray_tmp, "plugin": plugin, "scripts": scripts, "work": tmp_path}
    kill_session(marker, ray_tmp)
    shutil.rmtree(ray_tmp, ignore_errors=True)


def test_head_waits_for_the_worker_then_serves_and_notices_its_death(
    rendered_head: dict,  # type: ignore[type-arg]
    ray_dirs: dict[str, Path],
    models_dir: Path,
) -> None:
    import ray
    from dflash_ops.local import stack

    # The Ray this test runs is the engine image's (one pin: docker/ray-version.txt), which the
    # chart tells KubeRay.
    pin = (REPO_ROOT / "docker" / "ray-version.txt").read_text().strip()
    assert ray.__version__ == pin == rendered_head["rayVersion"]
    state_dir = ray_dirs["work"] / "stack"
    state_dir.mkdir()
    (state_dir / "models").symlink_to(models_dir)
    config = stack.StackConfig(state_dir=state_dir, method="off")
    stack.ensure_models(config)
    target = config.target_dir
    for name, text in rendered_head["scripts"].items():
        (ray_dirs["scripts"] / name).write_text(text)
    gcs_port, api_port = int(outside_worker_ports()), int(outside_worker_ports())
    # What KubeRay would generate for this head (its rayStartParams, with --block), plus the
    # loopback addresses and ports two raylets on one host need; one "GPU" per node here.
    params = dict(rendered_head["group"]["rayStartParams"])
    params.update(node_ports("head"))
    params.update(
        {
            "num-gpus": "1",
            "num-cpus": "2",
            "node-ip-address": HEAD_IP,
            "port": str(gcs_port),
            "dashboard-host": HEAD_IP,
            "dashboard-port": outside_worker_ports(),
            "ray-client-server-port": outside_worker_ports(),
            "temp-dir": str(ray_dirs["ray_tmp"]),
        }
    )
    start = kuberay_start_command("head", kuberay_start_params("head", params, {}))
    assert "--block" in start
    container = rendered_head["group"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["/bin/bash", "/etc/dflash-serve/ray/ray-head.sh"]
    rendered_env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    # A test earlier in the session may have pinned VLLM_TARGET_DEVICE=cpu in this process (the
    # planner's in-process engine does); vLLM then ignores platform plugins, so it is dropped.
    inherited = {k: v for k, v in os.environ.items() if k != "VLLM_TARGET_DEVICE"}
    env = inherited | {
        "KUBERAY_GEN_RAY_START_CMD": start,
        "DFLASH_RAY_EXPECTED_NODES": rendered_env["DFLASH_RAY_EXPECTED_NODES"],
        "DFLASH_RAY_EXPECTED_GPUS": "2",  # one per node here, 2 x 2 in the render
        "DFLASH_RAY_JOIN_TIMEOUT_S": "300",
        "RAY_ADDRESS": f"{HEAD_IP}:{gcs_port}",
        "VLLM_HOST_IP": HEAD_IP,
        "RAY_USAGE_STATS_ENABLED": "0",
        "DFLASH_TEST_RAY_SESSION": ray_dirs["ray_tmp"].name,
        "DFLASH_TEST_RAY_CPU_PLATFORM": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "PYTHONPATH": os.pathsep.join([str(ray_dirs["plugin"]), str(REPO_ROOT)]),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    # The rendered vLLM arguments are for GPUs; the CPU engine gets the tiny model, TP2 on Ray.
    vllm = [
        "vllm",
        "serve",
        str(target),
        "--served-model-name",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        str(api_port),
        "--dtype",
        "float32",
        "--max-model-len",
        "1024",
        "--tensor-parallel-size",
        "2",
        "--distributed-executor-backend",
        "ray",
        "--enforce-eager",
    ]
    log_path = ray_dirs["work"] / "head.log"
    with log_path.open("w") as log:
        head = subprocess.Popen(
            ["/bin/bash", str(ray_dirs["scripts"] / "ray-head.sh"), *vllm],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def head_log() -> str:
        return log_path.read_text(errors="replace")

    try:
        # The head alone waits (it reports every 10 s) and does not start vLLM; that it kept
        # waiting shows below: the worker started after this report is the one it saw join.
        deadline = time.monotonic() + 120
        while "waiting for the cluster: 1/2 nodes" not in head_log():
            assert head.poll() is None, failure_summary(head_log())
            assert time.monotonic() < deadline, failure_summary(head_log())
            time.sleep(1)
        assert head.poll() is None and http_status(f"http://127.0.0.1:{api_port}/health") is None
        assert "exec vllm" not in head_log()

        worker_params = node_ports("worker")
        worker_params.update(
            {
                "num-gpus": "1",
                "num-cpus": "2",
                "node-ip-address": WORKER_IP,
                "address": f"{HEAD_IP}:{gcs_port}",
            }
        )
        worker_start = kuberay_start_command("worker", worker_params)
        joined = subprocess.run(
            ["bash", "-c", worker_start], env=env, capture_output=True, text=True, timeout=120
        )
        assert joined.returncode == 0, (joined.stdout + joined.stderr)[-3000:]
        deadline = time.monotonic() + 600
        while http_status(f"http://127.0.0.1:{api_port}/health") != 200:
            assert head.poll() is None, failure_summary(head_log())
            assert time.monotonic() < deadline, failure_summary(head_log())
            time.sleep(2)
        text = head_log()
        waited = text.index("waiting for the cluster: 1/2 nodes")
        assert waited < text.index("2/2 nodes and 2/2 GPUs joined") < text.index("exec vllm serve")
        request = urllib.request.Request(
            f"http://127.0.0.1:{api_port}/v1/chat/completions",
            json.dumps(
                {
                    "model": "tiny",
                    "messages": [{"role": "user", "content": "Hi"}],
                    "max_tokens": 8,
                    "temperature": 0,
                }
            ).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as reply:
            answer = json.load(reply)
        assert answer["usage"]["completion_tokens"] == 8

        # The worker node dies: vLLM on the head must notice and exit.
        raylets = [
            pid
            for pid in session_processes(env["DFLASH_TEST_RAY_SESSION"])
            if f"--node_ip_address={WORKER_IP}" in command_line(pid)
            and "raylet" in command_line(pid)
        ]
        assert raylets, "the worker's raylet is not running"
        for pid in raylets:
            os.kill(pid, signal.SIGKILL)
        head.wait(timeout=120)
        assert "died unexpectedly" in head_log()
        assert http_status(f"http://127.0.0.1:{api_port}/health") is None
    finally:
        if head.poll() is None:
            os.killpg(head.pid, signal.SIGKILL)
