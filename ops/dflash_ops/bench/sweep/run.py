"""`dflash-serve bench sweep`: method x k x load, one engine setting at a time, resumable.

DIR/sweep.json holds the plan and which settings are measured; each setting's benchmark goes to
DIR/points/KEY/ (the same files as `bench`). A sweep started again with the same plan skips the
settings already measured and re-runs the one it was stopped in; a different plan is refused
unless --fresh. When every setting is measured: DIR/sweep-results.json (figures, recommendation,
prediction vs measurement), DIR/sweep.md, DIR/recommended-values.yaml (with the helm deployer
and a speculative recommendation, sidecar.baseline: the acceptance measured on this traffic),
DIR/baseline.yaml (the same baseline, for `local up --baseline`) and the pictures.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from dflash_ops.bench.core.prompts import Prompt
from dflash_ops.bench.core.results import BenchResult, BenchSettings
from dflash_ops.bench.core.run_directory import BenchInterrupted, run_into, save_json
from dflash_ops.bench.core.runner import BenchStopped, Level, Target
from dflash_ops.bench.sweep import live_predictions
from dflash_ops.bench.sweep.analysis import (
    SweepAnalysis,
    analyse,
    recommended_values,
    sweep_baseline,
    table,
)
from dflash_ops.bench.sweep.deployers import Deployer, Setting, say
from dflash_ops.bench.sweep.live_predictions import record_level
from dflash_ops.errors import UserError
from dflash_ops.speculative_setting import ScheduleValue
from dflash_ops.vocabulary import LocalModels

DERIVE: Literal["derive"] = "derive"
NO_SCHEDULE: Literal["off"] = "off"
SIDECAR: Literal["sidecar"] = "sidecar"


class SweepPlan(BaseModel):
    settings: list[Setting]
    levels: list[Level]
    bench: BenchSettings
    deployer: str
    models: LocalModels | None = None  # the local deployer's model pair
    step_cost_from: Path | None = Field(
        default=None,
        description="an earlier sweep whose step cost the largest static k's sidecar predicts "
        "with (live_predictions.py)",
    )
    schedule: Literal["derive", "off", "sidecar"] | ScheduleValue = Field(
        default=DERIVE,
        description="derive: a k schedule from the static settings' measurements, run and "
        "verified after them; off: none; sidecar: the one the watched sidecar recommends for "
        "the whole run; or a schedule (short form) to verify",
    )


class SweepState(BaseModel):
    plan: SweepPlan
    done: list[str] = []
    schedule_setting: Setting | None = None
    schedule_note: str | None = None  # why no schedule was run
    schedule_derivation: str | None = None  # where a derived schedule came from


def load_state(out: Path, plan: SweepPlan, fresh: bool) -> SweepState:
    path = out / "sweep.json"
    if fresh or not path.is_file():
        return SweepState(plan=plan)
    try:
        state = SweepState.model_validate_json(path.read_text())
    except (ValidationError, OSError) as err:
        raise UserError(
            f"{path} is not a sweep state ({err}); pass --fresh to start over"
        ) from None
    if state.plan != plan:
        raise UserError(
            f"{path} belongs to a sweep with other settings; resume it with the same flags, or "
            "pass --fresh to start over (its measurements are replaced)"
        )
    return state


def point_dir(out: Path, setting: Setting) -> Path:
    return out / "points" / setting.key


def run_sweep(
    out: Path,
    plan: SweepPlan,
    deployer: Deployer,
    model: str | None,
    api_key: str | None,
    prompts: list[Prompt] | None,
    fresh: bool = False,
) -> SweepAnalysis:
    out.mkdir(parents=True, exist_ok=True)
    state = load_state(out, plan, fresh)
    save_json(out / "sweep.json", state.model_dump_json(indent=2))
    todo = [s for s in plan.settings if s.key not in state.done]
    if len(todo) < len(plan.settings):
        say(f"resuming: {len(plan.settings) - len(todo)} of {len(plan.settings)} settings measured")
    try:
        for number, setting in enumerate(todo, start=1):
            say(f"setting {number}/{len(todo)}: {setting.key}")
            measure(out, plan, deployer, setting, model, api_key, prompts, state)
        scheduled = schedule_setting(out, plan, state)
        save_json(out / "sweep.json", state.model_dump_json(indent=2))
        if scheduled is not None and scheduled.key not in state.done:
            say(
                f"the k schedule {scheduled.schedule_text}: one more setting, verified against "
                "the rest"
            )
            measure(out, plan, deployer, scheduled, model, api_key, prompts, state)
    except (BenchInterrupted, KeyboardInterrupt):
        say(f"interrupted: {len(state.done)} settings kept in {out}; the same command resumes")
        deployer.finish()
        raise
    except BaseException:
        deployer.finish()
        raise
    deployer.finish()
    return finish(out, plan, state)


def measure(
    out: Path,
    plan: SweepPlan,
    deployer: Deployer,
    setting: Setting,
    model: str | None,
    api_key: str | None,
    prompts: list[Prompt] | None,
    state: SweepState,
) -> None:
    base_url = deployer.apply(setting)
    sidecar = deployer.live_sidecar(setting)
    point = point_dir(out, setting)
    try:
        target = Target(base_url, model, api_key)
        run_into(
            point, target, plan.levels, setting_bench(plan, setting), prompts,
            on_level=None if sidecar is None else partial(record_level, sidecar, point),
        )  # fmt: skip
        if sidecar is not None:
            live_predictions.record_run(sidecar, point)
    except BenchStopped as stopped:
        raise UserError(
            f"{setting.key}: the benchmark stopped early ({stopped.result.stop_reason}); "
            f"what it measured is in {point_dir(out, setting)}; run the sweep again to "
            "resume"
        ) from None
    state.done.append(setting.key)
    save_json(out / "sweep.json", state.model_dump_json(indent=2))


def setting_bench(plan: SweepPlan, setting: Setting) -> BenchSettings:
    """The plan's bench settings, its metadata naming the setting as vLLM names the engine's
    flags: the vLLM-format export of each point (`vllm bench sweep plot SWEEP --curve-by
    num_speculative_tokens`) tells the settings apart."""
    names = {
        "speculative_method": setting.method if setting.speculating else "off",
        "num_speculative_tokens": str(setting.k),
    }
    if setting.schedule is not None:
        names["speculative_schedule"] = setting.schedule_text
    return plan.bench.model_copy(update={"metadata": {**plan.bench.metadata, **names}})


def schedule_setting(out: Path, plan: SweepPlan, state: SweepState) -> Setting | None:
    """The schedule to run after the static settings (derived from their results, or the one
    the plan gives), or None with the reason in `state.schedule_note`."""
    from dflash_ops.bench.sweep.analysis import analyse
    from dflash_ops.bench.sweep.schedule_derivation import NoSchedule, derive_schedule

    if state.schedule_setting is not None or plan.schedule in (NO_SCHEDULE, None):
        return state.schedule_setting
    speculative = [s for s in plan.settings if s.speculating]
    if plan.schedule == SIDECAR:
        return sidecar_schedule(out, plan, state)
    if isinstance(plan.schedule, tuple):
        largest = max(k for _, _, k in plan.schedule)
        method = speculative[0].method if speculative else None
        if method is None or largest == 0:
            state.schedule_note = "the given schedule needs a speculative method and a k above 0"
            return None
        state.schedule_setting = Setting(largest, method, schedule=plan.schedule)
        return state.schedule_setting
    if len(plan.levels) < 2:
        state.schedule_note = "one load level: a schedule needs two or more"
        return None
    static = load_results(out, plan)
    derived = derive_schedule(analyse(static, with_capacity=False), static)
    if isinstance(derived, NoSchedule):
        state.schedule_note = derived.describe()
        return None
    state.schedule_setting = Setting(
        derived.largest_k, derived.method, schedule=tuple(derived.ranges)
    )
    state.schedule_derivation = derived.describe()
    say(f"the k schedule {derived.short_form}: {state.schedule_derivation}")
    return state.schedule_setting


def sidecar_schedule(out: Path, plan: SweepPlan, state: SweepState) -> Setting | None:
    """The schedule the watched setting's sidecar recommended over its whole run, or None with
    the reason (no recommendation, or a static one: that setting's own row is its measurement)."""
    for setting in plan.settings:
        path = point_dir(out, setting) / live_predictions.RUN_FILENAME
        if not path.is_file():
            continue
        advice = live_predictions.load_run(path)
        found = live_predictions.recommended_schedule(advice)
        if isinstance(found, str):
            state.schedule_note = f"the sidecar of {setting.key}: {found}"
            return None
        state.schedule_setting = Setting(
            max(k for _, _, k in found), setting.method, schedule=found
        )
        window = (advice.get("evidence") or {}).get("window")
        state.schedule_derivation = (
            f"recommended by the sidecar of {setting.key} over its {window} window of the whole "
            f"run: {advice.get('reason')}"
        )
        return state.schedule_setting
    state.schedule_note = "no sidecar answered for the whole run (--step-cost-from watches one)"
    return None


def load_results(out: Path, plan: SweepPlan) -> dict[Setting, BenchResult]:
    return {
        s: BenchResult.model_validate_json((point_dir(out, s) / "results.json").read_text())
        for s in plan.settings
    }


def finish(out: Path, plan: SweepPlan, state: SweepState) -> SweepAnalysis:
    from dflash_ops.bench.sweep import plots

    results = load_results(out, plan)
    scheduled = state.schedule_setting
    if scheduled is not None and scheduled.key in state.done:
        results[scheduled] = BenchResult.model_validate_json(
            (point_dir(out, scheduled) / "results.json").read_text()
        )
    analysis = analyse(
        results,
        schedule_note=state.schedule_note,
        schedule_derivation=state.schedule_derivation,
    )
    for setting in plan.settings:
        kept = live_predictions.load(point_dir(out, setting) / live_predictions.FILENAME)
        if kept:
            comparison = live_predictions.compare(setting, kept, results)
            analysis = analysis.model_copy(update={"live_predictions": comparison})
    save_json(out / "sweep-results.json", analysis.model_dump_json(indent=2))
    (out / "sweep.md").write_text(table(analysis))
    baseline = sweep_baseline(analysis, results)
    if baseline is not None:
        import yaml

        (out / "baseline.yaml").write_text(yaml.safe_dump(baseline.model_dump(mode="json")))
    # The baseline goes into the chart's values only when measured on the release itself: the
    # local stack's pair is not the model the chart serves.
    (out / "recommended-values.yaml").write_text(
        recommended_values(analysis, results, baseline, baseline_in_values=plan.deployer == "helm")
    )
    plots.draw(results, out)
    return analysis
