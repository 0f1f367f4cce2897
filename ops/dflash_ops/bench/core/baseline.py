"""The sidecar's baseline (dflash_sidecar.baseline) from a benchmark's results: the acceptance a
run measured, pooled over its levels (weighted by drafts), with the sampling and workload it was
measured on. `local up --baseline` and the sweep's recommended values hand it to the sidecar."""

from __future__ import annotations

from pathlib import Path

from dflash_sidecar.baseline import Baseline, BaselineError, load_baseline
from dflash_sidecar.verdict import k_lowered
from pydantic import ValidationError

from dflash_ops.bench.core.results import BenchResult, requests_described
from dflash_ops.errors import UserError


def baseline_of(result: BenchResult, source: str) -> Baseline:
    """The run's acceptance, every level's drafts together; a UserError when it has none or
    when a k schedule lowered k (drafted tokens per draft below the positions measured)."""
    levels = [lv.spec_decode for lv in result.levels if lv.spec_decode and lv.spec_decode.drafts]
    if not levels:
        raise UserError(
            f"{source}: no speculative-decoding figures to take a baseline from (a run "
            "without speculation, or against a server that exports none)"
        )
    k = max(len(s.per_position_acceptance) for s in levels)
    drafts = sum(s.drafts for s in levels)
    lowered = [s for s in levels if k_lowered(s.k_in_effect, k)]
    if lowered or any(len(s.per_position_acceptance) != k for s in levels):
        raise UserError(
            f"{source}: a k schedule lowered k during the run; take the baseline from a run at "
            "one static k (the sweep's static setting at the deployed largest k)"
        )
    per_position = [
        sum(s.per_position_acceptance[i] * s.drafts for s in levels) / drafts for i in range(k)
    ]
    workload = result.settings.workload()
    try:
        return Baseline(
            model=result.model,
            num_speculative_tokens=k,
            mean_acceptance_length=1 + sum(per_position),
            per_position_acceptance=per_position,
            sampling=workload["sampling"],
            workload=requests_described(workload),
            source=f"{source} ({result.started_at})",
        )
    except ValidationError as err:
        message = str(err.errors()[0]["msg"]).removeprefix("Value error, ")
        raise UserError(f"{source}: not a usable baseline: {message}") from None


def read_baseline(path: Path) -> Baseline:
    """A baseline from a file: a bench results.json, or a baseline (alone or under
    sidecar.baseline, as a sweep's recommended-values.yaml holds it)."""
    text = _read(path)
    if path.suffix == ".json" and '"levels"' in text:
        try:
            result = BenchResult.model_validate_json(text)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise UserError(f"--baseline {path}: not a bench results.json ({where}: "
                            f"{first['msg']})") from None  # fmt: skip
        return baseline_of(result, str(path))
    try:
        return load_baseline(path)
    except BaselineError as err:
        raise UserError(f"--{err}") from None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as err:
        raise UserError(f"--baseline {path}: cannot read it ({err.strerror})") from None
