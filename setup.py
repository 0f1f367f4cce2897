"""Bundle the files the CLI reads into the wheel: the Helm chart (its linked rules and dashboards
copied in), the Prometheus rules, the Grafana dashboards and the vLLM patch series. In a
checkout (and an editable install) the code reads them where they are; installed from a wheel,
from dflash_ops/assets and dflash_patches/series (dflash_ops.paths, dflash_patches.series)."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildWithAssets(build_py):
    def run(self) -> None:
        super().run()
        build = Path(self.build_lib)
        assets = build / "dflash_ops" / "assets"
        shutil.rmtree(assets, ignore_errors=True)
        # symlinks=False copies what the chart's files/ links point at.
        shutil.copytree(ROOT / "charts" / "dflash-serve", assets / "chart", symlinks=False)
        shutil.copytree(ROOT / "ops" / "prometheus" / "rules", assets / "prometheus" / "rules")
        shutil.copytree(ROOT / "ops" / "grafana" / "dashboards", assets / "grafana" / "dashboards")
        series = build / "dflash_patches" / "series"
        series.mkdir(parents=True, exist_ok=True)
        for path in [*ROOT.glob("patches/*.patch"), ROOT / "patches" / "manifest.json"]:
            shutil.copy2(path, series / path.name)


setup(cmdclass={"build_py": BuildWithAssets})
