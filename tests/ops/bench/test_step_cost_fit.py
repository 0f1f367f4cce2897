"""The step-cost fit recovers a known step cost from sweep measurements, reports its error, and
says in one line what a sweep lacks to determine one."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from dflash_ops.bench.core.results import RunningBatch
from dflash_ops.bench.sweep.deployers import Setting
from dflash_ops.bench.sweep.step_cost_fit import StepPoint, fit_step_cost, step_points
from dflash_ops.errors import UserError
from dflash_sidecar.step_cost import StepCostModel

from tests.ops.bench.test_sweep import level, result

TRUE = StepCostModel(
    base_s=0.020, per_request_s=0.0005, per_draft_token_s=0.0002, drafting_s=0.006,
    fit_error_rms=0, fit_error_max=0, points=1, max_batch=1,
)  # fmt: skip


def measured(
    batch: float, k: int, tau: float, noise: float = 0.0, rng: random.Random | None = None
) -> StepPoint:
    tps = batch * tau / TRUE.step_seconds(batch, k)
    if rng is not None:
        tps *= 1 + rng.uniform(-noise, noise)
    return StepPoint(batch, k, tau, tps)


def grid(noise: float = 0.0, seed: int = 0) -> list[StepPoint]:
    rng = random.Random(seed)
    return [
        measured(b, k, 1 + 0.7 * k / (1 + 0.3 * k) if k else 1.0, noise, rng)
        for k in (0, 2, 4, 7)
        for b in (1, 4, 16)
    ]


def test_exact_measurements_give_back_the_step_cost() -> None:
    model = fit_step_cost(grid())
    for name in ("base_s", "per_request_s", "per_draft_token_s", "drafting_s"):
        assert getattr(model, name) == pytest.approx(getattr(TRUE, name), rel=1e-6), name
    assert model.fit_error_max < 1e-9 and model.points == 12 and model.max_batch == 16


def test_noisy_measurements_report_their_error() -> None:
    model = fit_step_cost(grid(noise=0.05, seed=3))
    assert 0.005 < model.fit_error_rms < 0.05 and model.fit_error_max < 0.1


def test_without_k0_the_drafter_pass_cannot_be_told_from_the_base() -> None:
    # All k > 0: the drafter's pass folds into the base; the fit still predicts the points.
    points = [p for p in grid() if p.k > 0]
    model = fit_step_cost(points)
    assert model.drafting_s == 0.0 and model.fit_error_max < 1e-9


@pytest.mark.parametrize(
    ("points", "says"),
    [
        ([], "needs the sweep's measurements at two loads or more (got 0)"),
        ([measured(1, 2, 1.7)], "(got 1)"),
        ([measured(4, 2, 1.7)] * 3, "do not determine a step cost"),
    ],
)
def test_a_sweep_that_cannot_determine_it_says_what_to_add(
    points: list[StepPoint], says: str
) -> None:
    with pytest.raises(UserError) as err:
        fit_step_cost(points)
    assert says in str(err.value)


def test_sweep_results_become_points() -> None:
    per_pos = [0.8, 0.6]
    k0 = level(1, 47.6, 1, 30, [])
    k2 = level(4, 200, 5, 40, per_pos)
    for lv, batch in ((k0, 1.0), (k2, 3.5)):
        lv.running_batch = RunningBatch(mean=batch, p50=batch, p90=batch, max=batch, samples=5)
    no_batch = level(8, 300, 5, 40, per_pos)  # no running-batch samples: left out
    scheduled = level(1, 60, 1, 30, per_pos)
    scheduled.running_batch = k0.running_batch
    points = step_points(
        {
            Setting(0, "dflash"): result(k0),
            Setting(2, "dflash"): result(k2, no_batch),
            Setting(2, "dflash", schedule=((1, 65536, 2),)): result(scheduled),
        }
    )
    assert points == [StepPoint(1.0, 0, 1.0, 47.6), StepPoint(3.5, 2, 2.4, 200)]
    assert points[1].step_seconds == pytest.approx(3.5 * 2.4 / 200)


def test_the_sweeps_baseline_carries_the_step_cost_to_the_chart_and_the_sidecar(
    tmp_path: Path,
) -> None:
    """recommended-values.yaml puts the fitted model in sidecar.baseline.step_cost; the real
    chart takes it (its schema) and the sidecar's own loader reads it back from the ConfigMap."""

    import yaml
    from dflash_ops.bench.sweep.analysis import analyse, recommended_values, sweep_baseline
    from dflash_ops.chart.helm import helm_template
    from dflash_sidecar.baseline import load_baseline

    per_pos = [0.8, 0.6]
    results = {}
    for k, taus in ((0, 1.0), (2, 2.4)):
        levels = []
        for concurrency in (1, 8):
            tps = measured(concurrency * 0.9, k, taus).tokens_per_s
            lv = level(concurrency, tps, tps * 0.01, 30, per_pos if k else [])
            b = concurrency * 0.9
            lv.running_batch = RunningBatch(mean=b, p50=b, p90=b, max=b, samples=5)
            levels.append(lv)
        results[Setting(k, "dflash")] = result(*levels)
    analysis = analyse(results, with_capacity=False)
    baseline = sweep_baseline(analysis, results)
    assert baseline is not None and baseline.step_cost is not None
    assert baseline.step_cost.points == 4 and baseline.step_cost.fit_error_max < 1e-6
    values = tmp_path / "recommended-values.yaml"
    values.write_text(recommended_values(analysis, results, baseline))
    assert (
        "# sidecar.baseline.step_cost: the step time fitted from 4 of these" in values.read_text()
    )
    rendered = helm_template([values], ["model.servedName=m"], "dflash", "llm")
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(rendered) if d}
    data = docs[("ConfigMap", "dflash-dflash-serve-sidecar-baseline")]["data"]["baseline.yaml"]
    (tmp_path / "baseline.yaml").write_text(data)
    assert load_baseline(tmp_path / "baseline.yaml", "m", 2) == baseline


def write_sweep(directory: Path, taus: dict[int, float], noise: float = 0.0) -> None:
    """A finished sweep directory of static settings at concurrency 1 and 8, measured from TRUE."""
    from dflash_ops.bench.core.runner import Level
    from dflash_ops.bench.sweep.run import SweepPlan, SweepState, point_dir

    from tests.ops.bench.test_sweep import SETTINGS

    plan = SweepPlan(
        settings=[Setting(k, "dflash") for k in taus],
        levels=[Level(concurrency=1), Level(concurrency=8)],
        bench=SETTINGS,
        deployer="local",
        schedule="off",
    )
    for setting in plan.settings:
        levels = []
        for concurrency in (1, 8):
            b = concurrency * 0.9
            tps = measured(b, setting.k, taus[setting.k]).tokens_per_s * (1 + noise)
            per_pos = [(taus[setting.k] - 1) / setting.k] * setting.k if setting.k else []
            lv = level(concurrency, tps, 1, 30, per_pos)
            lv.running_batch = RunningBatch(mean=b, p50=b, p90=b, max=b, samples=5)
            levels.append(lv)
        out = point_dir(directory, setting)
        out.mkdir(parents=True)
        (out / "results.json").write_text(result(*levels).model_dump_json())
    (directory / "sweep.json").write_text(SweepState(plan=plan).model_dump_json())


def test_bench_step_cost_fits_one_sweep_and_predicts_another(tmp_path: Path) -> None:
    """Fitted on greedy-like acceptance, the model predicts a sweep of other acceptance (and 3%
    faster measurements) from that sweep's own acceptance: every error is that 3%."""
    import subprocess
    import sys

    write_sweep(tmp_path / "greedy", {0: 1.0, 2: 2.4, 4: 3.1})
    write_sweep(tmp_path / "sampled", {0: 1.0, 2: 1.9, 4: 2.3}, noise=0.03)
    done = subprocess.run(
        [sys.executable, "-m", "dflash_ops.cli", "bench", "step-cost", str(tmp_path / "greedy"),
         "--against", str(tmp_path / "sampled")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "(6 measurements)" in out and "throughput fit error 0.0% rms" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 6 and all(row.endswith("| -2.9% |") for row in rows), rows
    assert "largest error 2.9%" in out
    missing = subprocess.run(
        [sys.executable, "-m", "dflash_ops.cli", "bench", "step-cost", str(tmp_path / "none")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert missing.returncode == 2 and "not a finished sweep" in missing.stderr
    assert "Traceback" not in missing.stderr
