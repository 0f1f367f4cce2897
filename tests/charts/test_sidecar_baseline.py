"""sidecar.baseline (templates/sidecar-baseline.yaml): the baseline a sweep measured on the
user's traffic, handed to the sidecar as the file it reads at start. Judged by the sidecar's own
loader and settings on the rendered ConfigMap and container, in both layouts; a baseline of
another k or model, or without speculation, is refused by name at render."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from dflash_ops.cli import build_parser
from dflash_ops.cli.sidecar import settings_from
from dflash_ops.errors import UserError
from dflash_sidecar.baseline import Baseline, load_baseline, thresholds_from

from tests.charts.conftest import RWX, render
from tests.charts.consumers import pod_templates
from tests.charts.test_day2_contracts import refused

BASELINE = {
    "model": "qwen3.8-flash-next",
    "num_speculative_tokens": 7,
    "mean_acceptance_length": 2.5,
    "per_position_acceptance": [0.6, 0.4, 0.2, 0.15, 0.1, 0.03, 0.02],
    "sampling": "temperature 0.7, top-p 0.95",
    "source": "bench sweep 2026-12-07",
}


def values_file(tmp_path: Path, baseline: dict[str, Any]) -> Path:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"sidecar": {"baseline": baseline}}))
    return path


@pytest.mark.parametrize(
    "layout", [[], ["distributed.enabled=true", RWX]], ids=["deployment", "ray"]
)
def test_the_sidecar_reads_the_baseline_it_is_given(tmp_path: Path, layout: list[str]) -> None:
    manifests = render(*layout, values=[values_file(tmp_path, BASELINE)])
    data = manifests[("ConfigMap", "t-dflash-serve-sidecar-baseline")]["data"]["baseline.yaml"]
    ((where, template),) = [
        (w, t) for w, t in pod_templates(manifests)
        if any(c["name"] == "sidecar" for c in t["spec"]["containers"])
    ]  # fmt: skip
    sidecar = next(c for c in template["spec"]["containers"] if c["name"] == "sidecar")
    env = {e["name"]: e.get("value") for e in sidecar["env"]}
    path = Path(env["DFLASH_SIDECAR_BASELINE_FILE"])
    (mount,) = [m for m in sidecar["volumeMounts"] if m["name"] == "sidecar-baseline"]
    assert Path(mount["mountPath"]) == path.parent and mount["readOnly"], where
    volume = next(v for v in template["spec"]["volumes"] if v["name"] == "sidecar-baseline")
    assert volume["configMap"]["name"] == "t-dflash-serve-sidecar-baseline"
    assert "checksum/sidecar-baseline" in template["metadata"]["annotations"]
    # The four acceptance thresholds come from the baseline, not from the chart.
    assert not [name for name in env if "POSITION0" in name or "MEAN_ACCEPTANCE" in name]
    # What the sidecar makes of it: its container's arguments and environment, the file as
    # mounted (here, where the test can read it).
    local = tmp_path / path.name
    local.write_text(data)
    args = build_parser().parse_args(sidecar["args"])
    variables = {k: v for k, v in env.items() if v is not None} | {
        "DFLASH_SIDECAR_BASELINE_FILE": str(local)
    }
    settings = settings_from(args, variables)
    assert settings.baseline == Baseline.model_validate(BASELINE)
    assert settings.thresholds == thresholds_from(Baseline.model_validate(BASELINE),
                                                  base=settings.thresholds)  # fmt: skip
    assert load_baseline(local, "qwen3.8-flash-next", 7) == settings.baseline


def test_without_a_baseline_nothing_changes() -> None:
    manifests = render()
    assert ("ConfigMap", "t-dflash-serve-sidecar-baseline") not in manifests


@pytest.mark.parametrize(
    ("change", "sets", "expected"),
    [
        ({"num_speculative_tokens": 3, "per_position_acceptance": [0.6, 0.4, 0.2]}, [],
         "sidecar.baseline was measured at k 3, and the release drafts up to k 7"),
        ({"model": "glm-5.3-flash"}, [], 'measured on model "glm-5.3-flash"'),
        ({}, ["speculative.method=off"], "speculative.method is off"),
        ({"sampling": None}, [], "sampling"),
    ],
)  # fmt: skip
def test_a_baseline_that_cannot_apply_is_refused_by_name(
    tmp_path: Path, change: dict[str, Any], sets: list[str], expected: str
) -> None:
    baseline = {k: v for k, v in (BASELINE | change).items() if v is not None}
    message = refused(*sets, values=[values_file(tmp_path, baseline)])
    assert expected in message, message


@pytest.mark.parametrize(
    ("threshold", "value"),
    [("collapsedMeanAcceptanceLength", "1.5"), ("degradedMeanAcceptanceLength", "1.5"),
     ("collapsedPosition0", "0.3"), ("degradedPosition0", "0.3")],
)  # fmt: skip
def test_a_threshold_beside_a_baseline_is_refused_as_the_sidecar_refuses_it(
    tmp_path: Path, threshold: str, value: str
) -> None:
    """With a baseline the chart does not pass the four acceptance thresholds: a value set for
    one would be ignored without a word, and the sidecar refuses the pair (baseline_file and a
    threshold). The chart refuses it at render; minDrafts stays a setting of its own."""
    values = [values_file(tmp_path, BASELINE)]
    message = refused(f"sidecar.thresholds.{threshold}={value}", values=values)
    assert f"sidecar.thresholds.{threshold} {value} is set beside sidecar.baseline" in message
    with pytest.raises(UserError, match="baseline_file and verdict thresholds both given"):
        settings_from(
            build_parser().parse_args(["sidecar"]),
            {"DFLASH_SIDECAR_BASELINE_FILE": str(tmp_path / "b.yaml"),
             f"DFLASH_SIDECAR_{snake(threshold).upper()}": value},
        )  # fmt: skip
    render("sidecar.thresholds.minDrafts=50", values=values)  # allowed


def snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)
