"""The real `helm` binary: `helm template` of the chart."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import yaml

from dflash_ops.errors import UserError
from dflash_ops.paths import CHART_DIR, TOOLS_BIN

EXAMPLE_RELEASE = "dflash"
EXAMPLE_NAMESPACE = "llm"


def helm_binary() -> str:
    local = TOOLS_BIN / "helm"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which("helm")
    if found is None:
        raise UserError(
            "helm is not installed: run `make setup` (helm v4 in .cache/bin) or install it"
        )
    return found


def helm_template(
    values_files: list[Path], sets: list[str], release: str, namespace: str, chart: Path = CHART_DIR
) -> str:
    cmd = [helm_binary(), "template", release, str(chart), "--namespace", namespace]
    for path in values_files:
        cmd += ["-f", str(path)]
    for item in sets:
        cmd += ["--set", item]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        errors = [
            line
            for line in result.stderr.splitlines()
            if "symbolic link" not in line and line.strip()
        ]
        raise UserError("the chart refused these values:\n  " + "\n  ".join(errors))
    return result.stdout


def engine_args_in_render(rendered: str) -> list[str]:
    """The arguments after `vllm serve` of the one engine a chart render starts."""
    for doc in yaml.safe_load_all(rendered):
        if not doc:
            continue
        if doc["kind"] == "Deployment":
            container = doc["spec"]["template"]["spec"]["containers"][0]
            assert container["command"] == ["vllm", "serve"]
            return list(container["args"])
        if doc["kind"] == "RayCluster":
            container = doc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
            assert container["args"][:2] == ["vllm", "serve"]
            return list(container["args"][2:])
    raise ValueError("no engine in the render")
