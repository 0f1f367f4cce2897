"""The benchmark as a Kubernetes Job in the release's namespace: it calls the release's Service
from inside the cluster (a port-forward adds its own latency and throughput ceiling).

The pod runs `dflash-serve bench` from the CPU image as an init container writing to an emptyDir,
then two containers print what it wrote, so the results are fetched with `kubectl logs` and
nothing measured is lost when the benchmark fails part-way:

    kubectl logs job/NAME -c results  > results.json
    kubectl logs job/NAME -c requests > requests.jsonl
    kubectl logs job/NAME -c bench     # its progress and table

The `results` container exits with the benchmark's exit code, so the Job fails when it did.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

CHART_NAME = "dflash-serve"
RESULTS_DIR = "/results"
SERVICE_PORT = 8000


def release_fullname(release: str) -> str:
    """The chart's `dflash-serve.fullname` (without fullnameOverride)."""
    name = release if CHART_NAME in release else f"{release}-{CHART_NAME}"
    return name[:63].rstrip("-")


class JobSpec(BaseModel):
    release: str
    namespace: str | None = None
    image: str
    base_url: str | None = None  # default: the release's Service
    api_key_secret: tuple[str, str] | None = None  # (name, key), as auth.apiKeySecret
    bench_args: list[str] = []
    active_deadline_s: int = 24 * 3600
    keep_s: int = 7 * 24 * 3600

    @property
    def name(self) -> str:
        return f"{release_fullname(self.release)[:52].rstrip('-')}-bench"

    @property
    def target(self) -> str:
        return self.base_url or f"http://{release_fullname(self.release)}:{SERVICE_PORT}"


def bench_command(results_dir: str = RESULTS_DIR) -> list[str]:
    """The init container: the benchmark with the user's flags ("$@"), its exit code kept."""
    script = (
        f'dflash-serve bench --out {results_dir} "$@"; code=$?; '
        f"echo $code > {results_dir}/exit-code; exit 0"
    )
    return ["/bin/sh", "-c", script, "bench"]


def print_command(
    name: str, results_dir: str = RESULTS_DIR, exit_with_bench: bool = False
) -> list[str]:
    """A container printing one result file (and, for `results`, exiting as the bench did)."""
    missing = f"echo 'no {name}: see the bench container' >&2"
    script = f"cat {results_dir}/{name} 2>/dev/null || {missing}"
    if exit_with_bench:
        script += f"; exit $(cat {results_dir}/exit-code 2>/dev/null || echo 1)"
    return ["/bin/sh", "-c", script]


def manifest(spec: JobSpec) -> dict[str, Any]:
    security = {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    mounts = [
        {"name": "results", "mountPath": RESULTS_DIR},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    env: list[dict[str, Any]] = [
        {"name": "HOME", "value": "/tmp"},
        {"name": "MPLCONFIGDIR", "value": "/tmp/matplotlib"},
    ]
    if spec.api_key_secret is not None:
        secret, key = spec.api_key_secret
        env.append(
            {
                "name": "OPENAI_API_KEY",
                "valueFrom": {"secretKeyRef": {"name": secret, "key": key}},
            }
        )
    resources = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}

    def printer(name: str, file: str, exit_with_bench: bool) -> dict[str, Any]:
        return {
            "name": name,
            "image": spec.image,
            "command": print_command(file, exit_with_bench=exit_with_bench),
            "volumeMounts": mounts,
            "securityContext": security,
            "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
        }

    metadata: dict[str, Any] = {
        "name": spec.name,
        "labels": {
            "app.kubernetes.io/name": "dflash-serve-bench",
            "app.kubernetes.io/instance": spec.release,
            "app.kubernetes.io/component": "bench",
        },
    }
    if spec.namespace:
        metadata["namespace"] = spec.namespace
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": 0,  # a second attempt would measure another run, not this one
            "activeDeadlineSeconds": spec.active_deadline_s,
            "ttlSecondsAfterFinished": spec.keep_s,
            "template": {
                "metadata": {"labels": dict(metadata["labels"])},
                "spec": {
                    "restartPolicy": "Never",
                    "enableServiceLinks": False,
                    "automountServiceAccountToken": False,
                    "securityContext": {"runAsNonRoot": True, "fsGroup": 1000},
                    "initContainers": [
                        {
                            "name": "bench",
                            "image": spec.image,
                            "command": bench_command(),
                            "args": ["--base-url", spec.target, *spec.bench_args],
                            "env": env,
                            "volumeMounts": mounts,
                            "securityContext": security,
                            "resources": resources,
                        }
                    ],
                    "containers": [
                        printer("results", "results.json", exit_with_bench=True),
                        printer("requests", "requests.jsonl", exit_with_bench=False),
                    ],
                    "volumes": [
                        {"name": "results", "emptyDir": {}},
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    }
