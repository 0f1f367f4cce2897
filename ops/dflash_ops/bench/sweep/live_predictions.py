"""The sidecar's live predictions set against the sweep's measurements.

With `bench sweep --step-cost-from DIR`, the sidecar of the setting at the sweep's largest static
k runs with a step-cost model fitted on an earlier sweep (DIR). At the end of each level the sweep
asks it what its last minute of live figures (the per-position acceptance the engine exported,
the running batch at every scrape) predicts for every k (GET /recommendation?window=1m), and
keeps the answer in points/KEY/sidecar-predictions.json. When the sweep is done, each prediction
is set against what the static setting at that k measured at that level: how far the sidecar's
recommendation can be trusted on this deployment and this traffic.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

from dflash_sidecar.recommendation import STEP_COST_DRIFT
from dflash_sidecar.step_cost import StepCostModel
from pydantic import BaseModel, Field

from dflash_ops.bench.core.results import BenchResult, LevelResult
from dflash_ops.bench.core.run_directory import save_json
from dflash_ops.bench.sweep.step_cost_fit import predictions, step_point
from dflash_ops.speculative_schedule import Schedule, parse_schedule
from dflash_ops.speculative_setting import SpeculativeSetting
from dflash_ops.vocabulary import MAX_K

# The sidecar window the sweep reads (one of the sidecar's default windows): each level must run
# at least this long for the window to hold that level's traffic alone.
WINDOW, WINDOW_S = "1m", 60.0
# The sweep's sidecar scrapes every second: 30 busy scrapes (the recommendation's minimum) fit in
# half the window.
SCRAPE_INTERVAL_S = 1.0
FILENAME = "sidecar-predictions.json"
# What the sidecar recommends for the setting's whole run (its longest window, GET
# /recommendation), asked once its last level ends: what `--schedule sidecar` verifies.
RUN_FILENAME = "sidecar-recommendation.json"


class LevelPrediction(BaseModel):
    """What the sidecar answered at the end of one level."""

    level: str
    level_seconds: float = Field(description="the level's measured runs, end to end")
    recommendation: dict[str, object] = Field(description="GET /recommendation?window=1m")


class LivePrediction(BaseModel):
    level: str
    k: int
    predicted_tokens_per_s: float
    measured_tokens_per_s: float
    measured_stdev: float
    error: float = Field(description="predicted over measured, minus 1")
    from_sweep_error: float | None = Field(
        default=None,
        description="the same step cost from the static setting's own measured running batch "
        "and acceptance (bench step-cost's prediction), over measured, minus 1: the part of the "
        "error that is the step cost's, not the live reading's",
    )
    step_cost_ratio: float | None = Field(
        default=None,
        description="the watched engine's busy output tokens/s over the step cost's prediction "
        "for it at that level (None: too few busy scrapes)",
    )
    scaled: bool = Field(
        default=False, description="the sidecar scaled its predictions by the ratio (drift)"
    )

    @property
    def unscaled_error(self) -> float:
        """The error of the step cost's own prediction from the live figures, before any scale."""
        if self.scaled and self.step_cost_ratio:
            return (self.error + 1) / self.step_cost_ratio - 1
        return self.error


class LiveComparison(BaseModel):
    watched: str = Field(description="the setting whose sidecar predicted")
    rows: list[LivePrediction]
    notes: list[str] = Field(description="levels without a prediction, and why")
    measured_on: str = Field(description="where the sidecar's step-cost model came from")

    @property
    def largest_error(self) -> float | None:
        return max((abs(r.error) for r in self.rows), default=None)


def level_seconds(level: LevelResult) -> float:
    return sum(run.wall_s for run in level.runs)


def record_level(sidecar_url: str, point: Path, level: LevelResult) -> None:
    """Ask the sidecar for its window's predictions and keep them beside the point's results
    (a sidecar that does not answer leaves a note instead: the measurement goes on)."""
    answer = ask(f"{sidecar_url}/recommendation?window={WINDOW}")
    path = point / FILENAME
    kept = load(path)
    label = level.label
    kept[label] = LevelPrediction(
        level=label, level_seconds=level_seconds(level), recommendation=answer
    )
    save_json(path, json.dumps({k: v.model_dump() for k, v in kept.items()}, indent=2))


def ask(url: str) -> dict[str, object]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            answer = json.load(reply)
    except (OSError, ValueError) as err:
        return {"available": False, "reason": f"GET {url} failed: {err}"}
    return answer if isinstance(answer, dict) else {"available": False, "reason": "not JSON"}


def record_run(sidecar_url: str, point: Path) -> None:
    save_json(point / RUN_FILENAME, json.dumps(ask(f"{sidecar_url}/recommendation"), indent=2))


def load_run(path: Path) -> dict[str, Any]:
    answer = json.loads(path.read_text())
    return answer if isinstance(answer, dict) else {}


def recommended_schedule(advice: dict[str, Any]) -> Schedule | str:
    """The schedule of a whole run's recommendation, or why there is none to verify."""
    schedule = advice.get("schedule")
    if not advice.get("available") or not isinstance(schedule, str):
        return f"no recommendation ({advice.get('reason', 'no answer')})"
    ranges = parse_schedule(schedule, MAX_K)
    if len(ranges) == 1:
        return (
            f"it recommends static k {ranges[0][2]} ({advice.get('reason')}): that static "
            "setting's own row is its measurement"
        )
    return ranges


def load(path: Path) -> dict[str, LevelPrediction]:
    if not path.is_file():
        return {}
    return {k: LevelPrediction.model_validate(v) for k, v in json.loads(path.read_text()).items()}


def compare(
    watched: SpeculativeSetting,
    kept: dict[str, LevelPrediction],
    results: dict[SpeculativeSetting, BenchResult],
) -> LiveComparison:
    """Each level's prediction of every k against the static setting at that k (same method,
    or off for k 0) measured at that level."""
    static = {
        s.k: r
        for s, r in results.items()
        if s.schedule is None and (s.k == 0 or s.method == watched.method)
    }
    rows, notes, measured_on = [], [], ""
    for label, kept_level in kept.items():
        answer = kept_level.recommendation
        by_k = answer.get("predicted_tokens_per_s_by_k")
        if not answer.get("available") or not isinstance(by_k, dict):
            notes.append(f"{label}: no prediction ({answer.get('reason', 'no answer')})")
            continue
        if kept_level.level_seconds < WINDOW_S:
            notes.append(
                f"{label}: no prediction (the level ran {kept_level.level_seconds:.0f} s, under "
                f"the sidecar's {WINDOW} window: give each level a minute or more, --duration "
                "and --repeats)"
            )
            continue
        evidence = answer.get("evidence")
        model, ratio, scaled = None, None, False
        if isinstance(evidence, dict):
            measured_on = str(evidence.get("measured_on", ""))
            if isinstance(evidence.get("step_cost"), dict):
                model = StepCostModel.model_validate(evidence["step_cost"])
            if isinstance(evidence.get("step_cost_ratio"), int | float):
                ratio = float(evidence["step_cost_ratio"])
            scaled = evidence.get("scaled") is True
        for k_text, predicted in sorted(by_k.items(), key=lambda item: int(item[0])):
            k = int(k_text)
            result = static.get(k)
            level = next(
                (lv for lv in (result.levels if result else []) if lv.label == label), None
            )
            if level is None:
                continue
            measured = level.output_tokens_per_s
            if measured.mean <= 0:
                continue
            rows.append(
                LivePrediction(
                    level=label,
                    k=k,
                    predicted_tokens_per_s=float(predicted),
                    measured_tokens_per_s=measured.mean,
                    measured_stdev=measured.stdev,
                    error=float(predicted) / measured.mean - 1,
                    from_sweep_error=from_own_figures(model, level, k),
                    step_cost_ratio=ratio,
                    scaled=scaled,
                )
            )
    return LiveComparison(watched=watched.key, rows=rows, notes=notes, measured_on=measured_on)


def from_own_figures(model: StepCostModel | None, level: LevelResult, k: int) -> float | None:
    """The step cost's prediction from the level's own running batch and acceptance, over
    what the level measured, minus 1 (None without a model, a batch or an acceptance)."""
    point = step_point(k, level)
    if model is None or point is None:
        return None
    return predictions(model, [point])[0].error


def _percent(error: float | None) -> str:
    return "n/a" if error is None else f"{error:+.1%}"


def _ratio(row: LivePrediction) -> str:
    if row.step_cost_ratio is None:
        return "n/a"
    return f"{row.step_cost_ratio:.2f}x" + (", scaled" if row.scaled else "")


def table(comparison: LiveComparison) -> str:
    lines = [
        f"The sidecar's live prediction (the {comparison.watched} setting's sidecar, its {WINDOW} "
        "window at the end of each level, step cost "
        f"{comparison.measured_on or 'from the earlier sweep'}) against the measurement:",
        "",
        "| level | k | predicted tok/s | measured tok/s | error | the step cost from the "
        "sweep's own figures | engine over step cost | the step cost alone |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {r.level} | {r.k} | {r.predicted_tokens_per_s:.1f} | "
            f"{r.measured_tokens_per_s:.1f} ± {r.measured_stdev:.1f} | {r.error:+.1%} | "
            f"{_percent(r.from_sweep_error)} | {_ratio(r)} | {r.unscaled_error:+.1%} |"
            for r in comparison.rows
        ),
        "",
        "(The sixth column is the same step cost fed the static setting's own measured running "
        "batch and acceptance, as bench step-cost does: where it errs as much as the live "
        "prediction, the error is the step cost's, not the live reading's. The seventh is the "
        "watched engine's busy output tokens/s over the step cost's prediction for it: beyond "
        f"1 +/- {STEP_COST_DRIFT} the sidecar takes the step cost as drifted and scales every "
        "prediction by "
        'it ("scaled"); the last is the live prediction\'s error before any scale.)',
        "",
    ]
    if comparison.largest_error is not None:
        lines += [f"Largest error {comparison.largest_error:.1%}.", ""]
    lines += [f"- {note}" for note in comparison.notes]
    return "\n".join(lines).rstrip() + "\n"
