"""Dockerfiles (hadolint), image names shared by `make images` and the chart, and the engine
image's patch step run against the real vllm==0.33.0 wheel (no Docker engine here)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO_ROOT, find_tool

DOCKERFILES = sorted((REPO_ROOT / "docker").glob("*.Dockerfile"))
STANDIN_DOCKERFILES = sorted((REPO_ROOT / "docker" / "standin").glob("*.Dockerfile"))


def test_four_dockerfiles_and_a_dockerignore() -> None:
    assert [p.name for p in DOCKERFILES] == [
        "cpu.Dockerfile",
        "router.Dockerfile",
        "sidecar.Dockerfile",
        "vllm.Dockerfile",
    ]
    ignored = (REPO_ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", ".venv-vllm033", ".venv-tools", ".cache"} <= set(ignored)


@pytest.mark.parametrize(
    "dockerfile", DOCKERFILES + STANDIN_DOCKERFILES, ids=lambda p: str(p.relative_to(REPO_ROOT))
)
def test_hadolint_clean(dockerfile: Path) -> None:
    result = subprocess.run(
        [find_tool("hadolint"), "--no-color", str(dockerfile)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_engine_image_is_pinned_and_labelled() -> None:
    text = (REPO_ROOT / "docker" / "vllm.Dockerfile").read_text()
    assert "ARG VLLM_BASE_IMAGE=docker.io/vllm/vllm-openai:v0.33.0" in text
    for label in (
        "org.opencontainers.image.source",
        "org.opencontainers.image.version",
        "io.dflash-serve.vllm.version",
        "io.dflash-serve.patch-series.sha256",
    ):
        assert label in text
    assert "docker/patch-vllm.sh" in text


def test_engine_image_says_which_patches_each_model_relies_on() -> None:
    import re

    from dflash_ops.model_profiles import PROFILES

    text = (REPO_ROOT / "docker" / "vllm.Dockerfile").read_text()
    labels = dict(re.findall(r'io\.dflash-serve\.patches\.([\w.-]+)="([\d,]+)"', text))
    assert labels == {name: ",".join(p.patches) for name, p in PROFILES.items()}


def make_images_tags(*overrides: str) -> list[str]:
    out = subprocess.run(
        ["make", "-s", "-n", "images", *overrides],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return re.findall(r"-t (\S+)", out)


def test_chart_default_images_are_what_make_images_tags() -> None:
    values = yaml.safe_load((REPO_ROOT / "charts" / "dflash-serve" / "values.yaml").read_text())
    chart = {
        f"{i['repository']}:{i['tag']}" for i in values["image"].values() if isinstance(i, dict)
    } | {f"{values['router']['image']['repository']}:{values['router']['image']['tag']}"}
    tags = make_images_tags()
    assert chart <= set(tags), (chart, tags)
    custom = make_images_tags("REGISTRY=registry.example.com/ml", "TAG=9.9.9")
    assert "registry.example.com/ml/sidecar:9.9.9" in custom
    assert "registry.example.com/ml/vllm-dflash:0.33.0-dflash-9.9.9" in custom


def test_make_images_passes_the_sidecar_extras() -> None:
    def sidecar_line(*overrides: str) -> str:
        out = subprocess.run(
            ["make", "-s", "-n", "images", *overrides],
            cwd=REPO_ROOT, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        return next(line for line in out.splitlines() if "sidecar.Dockerfile" in line)

    assert "--build-arg EXTRAS= " in sidecar_line()
    assert "--build-arg EXTRAS=kubernetes " in sidecar_line("SIDECAR_EXTRAS=kubernetes")


@pytest.fixture(scope="module")
def unpacked_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dflash_patches.series import load_manifest

    manifest = load_manifest()
    wheel = REPO_ROOT / ".cache" / "wheels" / manifest.wheel
    root = tmp_path_factory.mktemp("site-packages")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(root)
    return root


def run_script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    bash = shutil.which("bash")
    assert bash is not None
    return subprocess.run(
        [bash, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ | {"PYTHON": sys.executable} | (env or {}),
    )


@pytest.mark.vllm033
def test_image_patch_step_and_self_check_on_the_real_wheel(unpacked_wheel: Path) -> None:
    selfcheck = str(REPO_ROOT / "docker" / "selfcheck.py")
    before = subprocess.run(
        [sys.executable, selfcheck],
        capture_output=True,
        text=True,
        env=os.environ | {"PYTHONPATH": str(unpacked_wheel)},
    )
    assert before.returncode != 0 and "does not inherit EagleModelMixin" in before.stderr

    result = run_script(str(REPO_ROOT / "docker" / "patch-vllm.sh"), str(unpacked_wheel))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[4/4] self check" in result.stdout and "self check passed" in result.stdout
    assert "compiled vllm/platforms/interface.py" in result.stdout

    again = run_script(str(REPO_ROOT / "docker" / "patch-vllm.sh"), str(unpacked_wheel))
    assert again.returncode == 0 and "already applied" in again.stdout


@pytest.mark.vllm033
def test_image_patch_step_refuses_another_vllm(unpacked_wheel: Path, tmp_path: Path) -> None:
    fake = tmp_path / "site"
    (fake / "vllm").mkdir(parents=True)
    meta = fake / "vllm-0.32.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0\n")
    result = run_script(str(REPO_ROOT / "docker" / "patch-vllm.sh"), str(fake))
    assert result.returncode != 0
    assert "expected vllm==0.33.0" in result.stdout + result.stderr
