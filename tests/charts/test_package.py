"""The packaged chart (`helm package`, what a registry serves) installs as the README says: it
carries the profiles the README's install passes with -f, and renders as the checkout does."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import pytest
from dflash_ops.chart.helm import helm_binary, helm_template
from dflash_ops.paths import CHART_DIR, PROFILES_DIR

from tests.charts.conftest import PROFILES


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("package")
    subprocess.run(
        [helm_binary(), "package", str(CHART_DIR), "--destination", str(out)],
        check=True,
        capture_output=True,
    )
    (archive,) = out.glob("dflash-serve-*.tgz")
    with tarfile.open(archive) as tar:
        tar.extractall(out / "unpacked", filter="data")
    return archive


def test_the_package_carries_the_profiles(package: Path) -> None:
    with tarfile.open(package) as tar:
        names = set(tar.getnames())
    for profile in PROFILES:
        assert f"dflash-serve/profiles/{profile}.yaml" in names
    assert not any("/examples/" in name for name in names)  # rendered docs stay in the repo


@pytest.mark.parametrize("profile", PROFILES)
def test_the_package_renders_as_the_checkout(package: Path, profile: str) -> None:
    packaged_profile = package.parent / "unpacked" / "dflash-serve" / "profiles" / f"{profile}.yaml"
    from_package = helm_template([packaged_profile], [], "dflash", "llm", chart=package)
    from_checkout = helm_template([PROFILES_DIR / f"{profile}.yaml"], [], "dflash", "llm")
    assert from_package == from_checkout
