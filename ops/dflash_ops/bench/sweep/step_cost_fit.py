"""The deployment's step cost T(b, k), fitted from a sweep's own measurements
(dflash_sidecar.step_cost holds the model and what the sidecar predicts with it).

Each static setting at each load gives one measurement: the running batch b (the mean of
vllm:num_requests_running over the level), k, the mean acceptance length tau and the output
throughput; the step time it implies is b * tau / throughput. The four coefficients are the
least-squares fit of those step times, weighted to relative error; the fit error is the predicted
throughput against the measured one, over the same points.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dflash_sidecar.step_cost import StepCostModel

from dflash_ops.bench.core.results import BenchResult, LevelResult
from dflash_ops.errors import UserError
from dflash_ops.speculative_setting import SpeculativeSetting


@dataclass(frozen=True)
class StepPoint:
    """One measurement: running batch, k, mean acceptance length, output tokens/s."""

    batch: float
    k: int
    acceptance_length: float
    tokens_per_s: float

    @property
    def step_seconds(self) -> float:
        return self.batch * self.acceptance_length / self.tokens_per_s

    def features(self) -> list[float]:
        return [1.0, self.batch, self.batch * self.k, 1.0 if self.k > 0 else 0.0]


def step_points(results: dict[SpeculativeSetting, BenchResult]) -> list[StepPoint]:
    """Every static setting's levels with a running batch and a throughput; k 0 has tau 1."""
    return [
        point
        for setting, result in results.items()
        if setting.schedule is None  # a schedule's steps run several k: no one k to fit
        for level in result.levels
        if (point := step_point(setting.k, level)) is not None
    ]


def step_point(k: int, level: LevelResult) -> StepPoint | None:
    """One static setting's level as a measurement (k 0 has tau 1), or None without a running
    batch, a throughput or an acceptance."""
    batch = level.running_batch.mean if level.running_batch else None
    tps = level.output_tokens_per_s.mean
    spec = level.spec_decode
    tau = 1.0 if k == 0 else (spec.mean_acceptance_length if spec else None)
    if batch and batch > 0 and tps > 0 and tau:
        return StepPoint(batch, k, tau, tps)
    return None


def _solve(matrix: list[list[float]], vector: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when the system is singular."""
    n = len(vector)
    a = [[*row, v] for row, v in zip(matrix, vector, strict=True)]
    scale = max((abs(x) for row in matrix for x in row), default=1.0) or 1.0
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) <= 1e-12 * scale:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * y for x, y in zip(a[r], a[col], strict=True)]
    return [a[i][n] / a[i][i] for i in range(n)]


def _least_squares(points: Sequence[StepPoint], used: Sequence[int]) -> list[float] | None:
    """Weighted (1 / T) least squares over the features in `used`; the others are 0."""
    rows = []
    for p in points:
        features, seconds = p.features(), p.step_seconds
        rows.append([features[i] / seconds for i in used])
    target = [1.0] * len(points)  # T / T
    normal = [[sum(r[i] * r[j] for r in rows) for j in range(len(used))] for i in range(len(used))]
    right = [sum(r[i] * t for r, t in zip(rows, target, strict=True)) for i in range(len(used))]
    solved = _solve(normal, right)
    if solved is None:
        return None
    coefficients = [0.0] * 4
    for i, value in zip(used, solved, strict=True):
        coefficients[i] = value
    return coefficients


def fit_step_cost(points: Sequence[StepPoint]) -> StepCostModel:
    """The model of the sweep's points; one line naming what is missing when they cannot
    determine it (the drafter's pass needs k 0 beside k > 0, the per-token cost two k > 0 or
    two loads)."""
    if len(points) < 2:
        raise UserError(
            f"a step-cost model needs the sweep's measurements at two loads or more (got "
            f"{len(points)}): sweep at least two concurrencies"
        )
    coefficients = None
    for used in ((0, 1, 2, 3), (0, 1, 2), (0, 1)):
        if len(points) >= len(used):
            coefficients = _least_squares(points, used)
        if coefficients is not None:
            break
    if coefficients is None:
        raise UserError(
            "the sweep's measurements do not determine a step cost (one load at one k): sweep "
            "two concurrencies or more"
        )
    base, per_request, per_token, drafting = coefficients
    model = StepCostModel(
        base_s=base,
        per_request_s=per_request,
        per_draft_token_s=per_token,
        drafting_s=drafting,
        fit_error_rms=0.0,
        fit_error_max=0.0,
        points=len(points),
        max_batch=max(p.batch for p in points),
    )
    errors = [
        abs(p.batch * p.acceptance_length / model.step_seconds(p.batch, p.k) - p.tokens_per_s)
        / p.tokens_per_s
        for p in points
    ]
    rms = (sum(e * e for e in errors) / len(errors)) ** 0.5
    return model.model_copy(update={"fit_error_rms": rms, "fit_error_max": max(errors)})


@dataclass(frozen=True)
class Prediction:
    """One measurement of a sweep against what a step-cost model predicts for it."""

    point: StepPoint
    predicted_tokens_per_s: float

    @property
    def error(self) -> float:
        return self.predicted_tokens_per_s / self.point.tokens_per_s - 1


def predictions(model: StepCostModel, points: Sequence[StepPoint]) -> list[Prediction]:
    """Each point's throughput as the model predicts it from the point's own running batch and
    acceptance (what the sidecar does with the live ones)."""
    return [
        Prediction(p, p.batch * p.acceptance_length / model.step_seconds(p.batch, p.k))
        for p in points
    ]
