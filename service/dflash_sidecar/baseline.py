"""A baseline for the verdict: the acceptance a healthy deployment showed on the user's own
traffic (measured by `dflash-serve bench` or `bench sweep` at the recommended setting, with the
sampling and workload it was measured on).

The verdict's constants (VerdictThresholds' defaults) suit a trained draft on greedy traffic;
sampled traffic accepts less, and a healthy deployment would read degraded. With a baseline the
thresholds become fractions of what was measured: degraded below `degraded` of the baseline's
gain over 1 (mean acceptance length) or of its position-0 acceptance, collapsed below
`collapsed` of them. The thresholds so derived are the ones the sidecar exports
(dflash_verdict_threshold), so the collapse alert judges with them too.

This module holds the baseline and the derivation; reading it from the chart and `local up` comes
with them (issue: the verdict judges against the user's own traffic).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dflash_sidecar.step_cost import StepCostModel
from dflash_sidecar.verdict import VerdictThresholds


class BaselineError(ValueError):
    """A baseline file that cannot be used, in one line naming the file and the fix."""


class Baseline(BaseModel):
    model_config = ConfigDict(frozen=True, allow_inf_nan=False, extra="forbid")

    model: str = Field(min_length=1, description="the served model it was measured on")
    num_speculative_tokens: int = Field(ge=1, le=64, description="the k it was measured at")
    mean_acceptance_length: float = Field(gt=1, description="1 + accepted / drafts")
    per_position_acceptance: list[float] = Field(min_length=1)
    sampling: str = Field(min_length=1, description="how the traffic sampled, as bench says it")
    workload: str = Field(default="", description="the requests (dataset, lengths)")
    source: str = Field(default="", description="where and when it was measured")
    step_cost: StepCostModel | None = Field(
        default=None,
        description="the deployment's step time by running batch and k, fitted from the same "
        "sweep: what the schedule recommendation predicts with",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Baseline:
        if len(self.per_position_acceptance) != self.num_speculative_tokens:
            raise ValueError(
                f"{len(self.per_position_acceptance)} per-position figures for k "
                f"{self.num_speculative_tokens}"
            )
        if any(not 0 <= rate <= 1 for rate in self.per_position_acceptance):
            raise ValueError("per-position acceptance must lie in [0, 1]")
        if self.mean_acceptance_length > 1 + self.num_speculative_tokens:
            raise ValueError(
                f"mean acceptance length {self.mean_acceptance_length:g} exceeds 1 + k"
            )
        return self


class BaselineFractions(BaseModel):
    """Where the verdict turns, as fractions of the baseline."""

    model_config = ConfigDict(frozen=True, allow_inf_nan=False)

    degraded: float = Field(default=0.5, gt=0, lt=1)
    collapsed: float = Field(default=0.15, gt=0, lt=1)

    @model_validator(mode="after")
    def _ordered(self) -> BaselineFractions:
        if self.collapsed >= self.degraded:
            raise ValueError("the collapsed fraction must be below the degraded one")
        return self


def thresholds_from(
    baseline: Baseline,
    fractions: BaselineFractions | None = None,
    base: VerdictThresholds | None = None,
) -> VerdictThresholds:
    """`base` (min_drafts and all) with its four acceptance thresholds taken from the baseline."""
    fractions = fractions or BaselineFractions()
    base = base or VerdictThresholds()
    gain = baseline.mean_acceptance_length - 1
    position0 = baseline.per_position_acceptance[0]
    return VerdictThresholds(
        min_drafts=base.min_drafts,
        collapsed_mean_acceptance_length=1 + fractions.collapsed * gain,
        degraded_mean_acceptance_length=1 + fractions.degraded * gain,
        collapsed_position0=fractions.collapsed * position0,
        degraded_position0=fractions.degraded * position0,
    )


def load_baseline(
    path: Path, served_model: str | None = None, k_max: int | None = None
) -> Baseline:
    """The baseline in `path`: a YAML or JSON file holding it, either alone or under
    sidecar.baseline (a sweep's recommended-values.yaml). Refused, in one line, when malformed,
    measured on another model than `served_model`, or at another k than `k_max`."""
    import yaml

    try:
        loaded: Any = yaml.safe_load(path.read_text())
    except OSError as err:
        raise BaselineError(f"baseline {path}: cannot read it ({err.strerror})") from None
    except yaml.YAMLError as err:
        first = str(err).splitlines()[0]
        raise BaselineError(f"baseline {path}: not YAML or JSON ({first})") from None
    if isinstance(loaded, dict) and ({"sidecar", "speculative", "engine"} & loaded.keys()):
        sidecar = loaded.get("sidecar")  # chart values: the baseline is sidecar.baseline
        loaded = sidecar.get("baseline") if isinstance(sidecar, dict) else None
    if not isinstance(loaded, dict):
        raise BaselineError(
            f"baseline {path}: no baseline in it (expected sidecar.baseline, as a sweep's "
            "recommended-values.yaml has, or the baseline itself)"
        )
    try:
        baseline = Baseline.model_validate(loaded)
    except ValidationError as err:
        problem = err.errors()[0]
        where = ".".join(str(p) for p in problem["loc"]) or "baseline"
        message = str(problem["msg"]).removeprefix("Value error, ")
        raise BaselineError(
            f"baseline {path}: {where}: {message}; measure it again with bench sweep"
        ) from None
    if served_model is not None and baseline.model != served_model:
        raise BaselineError(
            f"baseline {path} was measured on model {baseline.model!r}, and the engine serves "
            f"{served_model!r}: measure a baseline for this model (bench sweep)"
        )
    if k_max is not None and baseline.num_speculative_tokens != k_max:
        raise BaselineError(
            f"baseline {path} was measured at k {baseline.num_speculative_tokens}, and the "
            f"engine drafts up to k {k_max}: measure it again at k {k_max}"
        )
    return baseline
