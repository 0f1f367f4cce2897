"""`bench step-cost`: the step-cost model of a finished sweep, and how it predicts another
sweep's measurements from that sweep's own acceptance and running batch."""

from __future__ import annotations

from pathlib import Path

from dflash_sidecar.baseline import Baseline

from dflash_ops.bench.core.baseline import baseline_of
from dflash_ops.bench.core.results import BenchResult
from dflash_ops.bench.sweep.deployers import Setting
from dflash_ops.bench.sweep.run import SweepState, load_results
from dflash_ops.bench.sweep.step_cost_fit import (
    StepPoint,
    fit_step_cost,
    predictions,
    step_points,
)
from dflash_ops.errors import UserError


def finished_sweep(directory: Path) -> dict[Setting, BenchResult]:
    """The static settings' results of a finished sweep directory (bench sweep --out DIR)."""
    path = directory / "sweep.json"
    try:
        state = SweepState.model_validate_json(path.read_text())
        return load_results(directory, state.plan)
    except (OSError, ValueError) as err:
        raise UserError(
            f"{directory}: not a finished sweep ({type(err).__name__}: {err})"
        ) from None


def sweep_points(directory: Path) -> list[StepPoint]:
    """The static measurements of a finished sweep directory."""
    return step_points(finished_sweep(directory))


def sidecar_baseline(directory: Path, watched: Setting, model: str) -> Baseline:
    """What `bench sweep --step-cost-from DIR` hands the sidecar of its `watched` static setting:
    the step cost fitted on DIR's sweep, with DIR's acceptance at that setting (the verdict's
    baseline)."""
    results = finished_sweep(directory)
    static = next((s for s in results if s.schedule is None and s.key == watched.key), None)
    if static is None:
        measured = ", ".join(s.key for s in sorted(results))
        raise UserError(
            f"--step-cost-from {directory}: it measured {measured}, not this sweep's "
            f"{watched.key}: give the earlier sweep k {watched.k} too, or this one a largest k "
            "it measured"
        )
    baseline = baseline_of(results[static], f"bench sweep {directory}, {static.key}")
    if baseline.model != model:
        raise UserError(
            f"--step-cost-from {directory}: measured on model {baseline.model!r}; this sweep "
            f"serves {model!r} (--models)"
        )
    try:
        step_cost = fit_step_cost(step_points(results))
    except UserError as err:
        raise UserError(f"--step-cost-from {directory}: {err}") from None
    return baseline.model_copy(update={"step_cost": step_cost})


def report(train: Path, against: Path | None) -> str:
    """The model fitted on `train`'s sweep, and how it predicts `against`'s measurements."""
    model = fit_step_cost(sweep_points(train))
    lines = [
        f"Step cost fitted on {train} ({model.points} measurements): base "
        f"{model.base_s * 1e3:.2f} ms + {model.per_request_s * 1e3:.3f} ms per request + "
        f"{model.per_draft_token_s * 1e3:.3f} ms per request per draft token + drafting "
        f"{model.drafting_s * 1e3:.2f} ms; throughput fit error {model.fit_error_rms:.1%} rms, "
        f"{model.fit_error_max:.1%} max",
    ]
    if against is not None:
        rows = predictions(model, sweep_points(against))
        lines += [
            "",
            f"Predicting {against} from its own acceptance and running batch:",
            "",
            "| k | running batch | mean acceptance length | measured tok/s | predicted tok/s "
            "| error |",
            "|---:|---:|---:|---:|---:|---:|",
            *(
                f"| {r.point.k} | {r.point.batch:.1f} | {r.point.acceptance_length:.2f} | "
                f"{r.point.tokens_per_s:.1f} | {r.predicted_tokens_per_s:.1f} | {r.error:+.1%} |"
                for r in rows
            ),
            "",
            f"largest error {max(abs(r.error) for r in rows):.1%}",
        ]
    return "\n".join(lines) + "\n"
