"""Render the chart with the real helm binary and index the manifests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from dflash_ops.chart.helm import helm_template
from dflash_ops.paths import PROFILES_DIR

Manifests = dict[tuple[str, str], dict[str, Any]]


def render(*sets: str, values: list[Path] | None = None, release: str = "t") -> Manifests:
    text = helm_template(values or [], list(sets), release, "llm")
    docs = [d for d in yaml.safe_load_all(text) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def one(manifests: Manifests, kind: str) -> dict[str, Any]:
    found = [m for (k, _), m in manifests.items() if k == kind]
    assert len(found) == 1, f"{len(found)} {kind}s"
    return found[0]


def container(manifests: Manifests, name: str) -> dict[str, Any]:
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == name)


def arg_after(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


@pytest.fixture(scope="module")
def default() -> Manifests:
    return render()


@pytest.fixture(scope="module")
def profile_paths() -> dict[str, Path]:
    return {p.stem: p for p in sorted(PROFILES_DIR.glob("*.yaml"))}


PROFILES = sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))
RWX = "modelCache.accessModes={ReadWriteMany}"
# Variants a user reaches with documented values, on top of the default profile.
VARIANTS: dict[str, list[str]] = {
    "network-policy": ["networkPolicy.enabled=true"],
    "no-model-cache": ["modelCache.enabled=false"],
    "no-download": ["modelDownload.enabled=false"],
    "events": ["sidecar.kubernetesEvents=true"],
    "auth": ["auth.apiKeySecret.name=vllm-api-key"],
    "replicas": ["replicas=3", RWX],
    "hpa": ["autoscaling.enabled=true", "autoscaling.engine=hpa", RWX],
    "keda": ["autoscaling.enabled=true", RWX],
    "keda-rolling": ["autoscaling.enabled=true", "rollout.strategy=RollingUpdate", RWX],
    "hf-token": ["model.hfTokenSecret.name=hf-token"],
    "ray-data": [
        "distributed.enabled=true",
        "distributed.layout=data",
        "networkPolicy.enabled=true",
        RWX,
    ],
    "ray-auth": [
        "distributed.enabled=true",
        "auth.apiKeySecret.name=vllm-api-key",
        RWX,
    ],
    "router-auth-netpol": [
        "router.enabled=true",
        "replicas=2",
        "auth.apiKeySecret.name=vllm-api-key",
        "networkPolicy.enabled=true",
        RWX,
    ],
    "router-ray": ["router.enabled=true", "distributed.enabled=true", RWX],
    "router-round-robin": ["router.enabled=true", "router.policy=round_robin", "replicas=2", RWX],
}


def render_docs(values: list[Path], sets: list[str], release: str = "dflash") -> Manifests:
    text = helm_template(values, sets, release, "llm")
    docs = [d for d in yaml.safe_load_all(text) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


@pytest.fixture(scope="session")
def renders() -> dict[str, Manifests]:
    """Every profile and every variant, rendered once for the session."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = {name: ([PROFILES_DIR / f"{name}.yaml"], []) for name in PROFILES}
    jobs.update({name: ([], sets) for name, sets in VARIANTS.items()})
    with ThreadPoolExecutor(8) as pool:
        done = {name: pool.submit(render_docs, *job) for name, job in jobs.items()}
        return {name: future.result() for name, future in done.items()}
