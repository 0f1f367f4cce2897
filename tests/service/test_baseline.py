"""The verdict against a baseline measured on the user's traffic (dflash_sidecar.baseline): the
thresholds it derives, each boundary just above and below, with and without a baseline and with
k lowered by a schedule; a baseline file that cannot be used is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from dflash_sidecar.baseline import (
    Baseline,
    BaselineError,
    BaselineFractions,
    load_baseline,
    thresholds_from,
)
from dflash_sidecar.verdict import Verdict, VerdictThresholds, judge

# Sampled traffic on a healthy draft (the paying pair at temperature 1, k 2: 1.63, 0.63 / 0.00).
SAMPLED = Baseline(
    model="paying",
    num_speculative_tokens=2,
    mean_acceptance_length=1.63,
    per_position_acceptance=[0.63, 0.0],
    sampling="temperature 1, per-request seeds, ignore-eos",
)
EPS = 1e-3


def test_the_thresholds_are_fractions_of_the_baseline() -> None:
    t = thresholds_from(SAMPLED, BaselineFractions(degraded=0.5, collapsed=0.15))
    assert t.degraded_mean_acceptance_length == pytest.approx(1 + 0.5 * 0.63)
    assert t.collapsed_mean_acceptance_length == pytest.approx(1 + 0.15 * 0.63)
    assert t.degraded_position0 == pytest.approx(0.5 * 0.63)
    assert t.collapsed_position0 == pytest.approx(0.15 * 0.63)
    assert t.min_drafts == VerdictThresholds().min_drafts


def test_a_healthy_sampled_window_reads_healthy_against_its_baseline_not_the_constants() -> None:
    window = (1000, 1.6, [0.6, 0.0])
    assert judge(*window, VerdictThresholds())[0] == Verdict.DEGRADED
    assert judge(*window, thresholds_from(SAMPLED))[0] == Verdict.HEALTHY


def boundary_cases() -> list[tuple[str, VerdictThresholds, float | None, int | None]]:
    baseline = thresholds_from(SAMPLED)
    return [
        ("constants", VerdictThresholds(), None, None),
        ("baseline", baseline, None, None),
        ("baseline, k lowered", baseline, 1.0, 2),
        ("constants, k lowered", VerdictThresholds(), 2.0, 4),
    ]


@pytest.mark.parametrize(("name", "t", "k_in_effect", "k_max"), boundary_cases())
def test_every_boundary_just_above_and_below(
    name: str, t: VerdictThresholds, k_in_effect: float | None, k_max: int | None
) -> None:
    share = 1.0 if k_in_effect is None or k_max is None else k_in_effect / k_max
    good_p0 = min(1.0, t.degraded_position0 + 0.2)

    def mal_at(threshold: float) -> float:
        return 1 + (threshold - 1) * share  # what the verdict compares with under a schedule

    def verdict(mal: float, p0: float) -> Verdict:
        return judge(1000, mal, [p0, 0.0], t, k_in_effect, k_max)[0]

    # The mean acceptance length: collapsed below its threshold, degraded below the next.
    good_mal = mal_at(t.degraded_mean_acceptance_length) + 0.2
    assert verdict(mal_at(t.collapsed_mean_acceptance_length) - EPS, good_p0) == Verdict.COLLAPSED
    assert verdict(mal_at(t.collapsed_mean_acceptance_length) + EPS, good_p0) == Verdict.DEGRADED
    assert verdict(mal_at(t.degraded_mean_acceptance_length) - EPS, good_p0) == Verdict.DEGRADED
    assert verdict(mal_at(t.degraded_mean_acceptance_length) + EPS, good_p0) == Verdict.HEALTHY
    # Position 0 is judged as it is, whatever k is in effect.
    assert verdict(good_mal, t.collapsed_position0 - EPS) == Verdict.COLLAPSED
    assert verdict(good_mal, t.collapsed_position0 + EPS) == Verdict.DEGRADED
    assert verdict(good_mal, t.degraded_position0 - EPS) == Verdict.DEGRADED
    assert verdict(good_mal, t.degraded_position0 + EPS) == Verdict.HEALTHY


def write(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data) if path.suffix == ".yaml" else json.dumps(data))
    return path


def test_a_baseline_is_read_alone_or_from_a_sweeps_values(tmp_path: Path) -> None:
    record = json.loads(SAMPLED.model_dump_json())
    alone = write(tmp_path / "baseline.json", record)
    values = write(tmp_path / "recommended-values.yaml", {
        "speculative": {"method": "draft_model"}, "sidecar": {"baseline": record},
    })  # fmt: skip
    assert load_baseline(alone) == load_baseline(values, "paying", 2) == SAMPLED


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not: [yaml", "not YAML or JSON"),
        ("speculative: {method: off}\n", "no baseline in it"),
        ({"model": "paying"}, "num_speculative_tokens: Field required"),
        ({"per_position_acceptance": [0.63]}, "1 per-position figures for k 2"),
        ({"per_position_acceptance": [1.5, 0.2]}, "must lie in [0, 1]"),
        ({"mean_acceptance_length": 3.5}, "exceeds 1 + k"),
        ({"mean_acceptance_length": 0.9}, "greater than 1"),
        ({"colour": "blue"}, "Extra inputs are not permitted"),
    ],
)
def test_a_malformed_baseline_is_refused_in_one_line(
    tmp_path: Path, content: object, expected: str
) -> None:
    path = tmp_path / "baseline.yaml"
    if isinstance(content, str):
        path.write_text(content)
    elif set(content) == {"model"}:  # type: ignore[arg-type]
        write(path, content)
    else:
        write(path, json.loads(SAMPLED.model_dump_json()) | content)  # type: ignore[operator]
    with pytest.raises(BaselineError) as refused:
        load_baseline(path)
    message = str(refused.value)
    assert expected in message and str(path) in message and "\n" not in message, message


def test_a_baseline_of_another_model_or_k_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "baseline.json", json.loads(SAMPLED.model_dump_json()))
    with pytest.raises(BaselineError, match="measured on model 'paying', and the engine serves"):
        load_baseline(path, served_model="qwen3.8-flash-next")
    with pytest.raises(BaselineError, match="measured at k 2, and the engine drafts up to k 7"):
        load_baseline(path, k_max=7)
    with pytest.raises(BaselineError, match="cannot read it"):
        load_baseline(tmp_path / "missing.yaml")


def test_the_fractions_are_ordered() -> None:
    with pytest.raises(ValueError, match="collapsed fraction must be below"):
        BaselineFractions(degraded=0.3, collapsed=0.4)


def test_the_sidecar_judges_against_its_baseline_and_says_which(
    tmp_path: Path, before_text: str, after_text: str
) -> None:
    """--baseline-file: the exported thresholds (which the collapse alert reads) are the
    baseline's fractions, /stats and /metrics name the baseline in force."""
    from dflash_sidecar.app import create_app
    from dflash_sidecar.engine_monitor import EngineMonitor
    from fastapi.testclient import TestClient

    from tests.service.fake_engine import FakeEngine
    from tests.service.test_app import fast_settings, wait_for

    path = write(tmp_path / "baseline.json", json.loads(SAMPLED.model_dump_json()))
    settings = fast_settings(baseline_file=str(path))
    assert settings.baseline == SAMPLED and settings.thresholds == thresholds_from(SAMPLED)
    engine = FakeEngine(before_text)
    monitor = EngineMonitor(settings, client=engine.client())
    with TestClient(create_app(settings, monitor)) as client:
        wait_for(lambda: client.get("/readyz").status_code == 200)
        stats = client.get("/stats").json()
        assert stats["baseline"]["sampling"] == SAMPLED.sampling
        body = client.get("/metrics").text
    derived = thresholds_from(SAMPLED)
    line = 'dflash_verdict_threshold{threshold="degraded_mean_acceptance_length"}'
    assert f"{line} {derived.degraded_mean_acceptance_length}" in body
    assert 'dflash_verdict_baseline_info{k="2",model="paying"' in body
    without = fast_settings()
    assert without.baseline is None


def test_baseline_settings_that_cannot_work_get_one_line(tmp_path: Path) -> None:
    import argparse

    from dflash_ops.cli import build_parser
    from dflash_ops.cli.sidecar import settings_from
    from dflash_ops.errors import UserError

    path = write(tmp_path / "baseline.json", json.loads(SAMPLED.model_dump_json()))
    parser = build_parser()
    # min_drafts is not one of the thresholds a baseline sets: it may be given beside one.
    args = parser.parse_args(["sidecar", "--baseline-file", str(path), "--min-drafts", "40"])
    kept = settings_from(args, {})
    assert kept.thresholds.min_drafts == 40 and kept.baseline == SAMPLED
    assert kept.thresholds == thresholds_from(SAMPLED, base=kept.thresholds)
    for extra, expected in (
        (["--speculative-tokens", "7"], "measured at k 2, and the engine drafts up to k 7"),
        (["--degraded-position0", "0.3"], "baseline_file and verdict thresholds both given"),
        (["--served-model", "other"], "measured on model 'paying'"),
    ):
        args: argparse.Namespace = parser.parse_args(
            ["sidecar", "--baseline-file", str(path), *extra]
        )
        with pytest.raises(UserError) as refused:
            settings_from(args, {})
        assert expected in str(refused.value) and "\n" not in str(refused.value)
