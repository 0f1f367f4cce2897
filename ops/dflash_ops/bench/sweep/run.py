"""`dflash-serve bench sweep`: method x k x load, one engine setting at a time, resumable.

DIR/sweep.json holds the plan and which settings are measured; each setting's benchmark goes to
DIR/points/KEY/ (the same files as `bench`). A sweep started again with the same plan skips the
settings already measured and re-runs the one it was stopped in; a different plan is refused
unless --fresh. When every setting is measured: DIR/sweep-results.json (figures, recommendation,
prediction vs measurement), DIR/sweep.md, DIR/recommended-values.yaml and the pictures.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ValidationError

from dflash_ops.bench.core.prompts import Prompt
from dflash_ops.bench.core.results import BenchResult, BenchSettings
from dflash_ops.bench.core.run_directory import BenchInterrupted, run_into, save_json
from dflash_ops.bench.core.runner import BenchStopped, Level, Target
from dflash_ops.bench.sweep.analysis import SweepAnalysis, analyse, recommended_values, table
from dflash_ops.bench.sweep.deployers import Deployer, Setting, say
from dflash_ops.errors import UserError
from dflash_ops.vocabulary import LocalModels


class SweepPlan(BaseModel):
    settings: list[Setting]
    levels: list[Level]
    bench: BenchSettings
    deployer: str
    models: LocalModels | None = None  # the local deployer's model pair


class SweepState(BaseModel):
    plan: SweepPlan
    done: list[str] = []


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
            base_url = deployer.apply(setting)
            try:
                target = Target(base_url, model, api_key)
                run_into(point_dir(out, setting), target, plan.levels, plan.bench, prompts)
            except BenchStopped as stopped:
                raise UserError(
                    f"{setting.key}: the benchmark stopped early ({stopped.result.stop_reason}); "
                    f"what it measured is in {point_dir(out, setting)}; run the sweep again to "
                    "resume"
                ) from None
            state.done.append(setting.key)
            save_json(out / "sweep.json", state.model_dump_json(indent=2))
    except (BenchInterrupted, KeyboardInterrupt):
        say(f"interrupted: {len(state.done)} settings kept in {out}; the same command resumes")
        deployer.finish()
        raise
    except BaseException:
        deployer.finish()
        raise
    deployer.finish()
    return finish(out, plan)


def load_results(out: Path, plan: SweepPlan) -> dict[Setting, BenchResult]:
    return {
        s: BenchResult.model_validate_json((point_dir(out, s) / "results.json").read_text())
        for s in plan.settings
    }


def finish(out: Path, plan: SweepPlan) -> SweepAnalysis:
    from dflash_ops.bench.sweep import plots

    results = load_results(out, plan)
    analysis = analyse(results)
    save_json(out / "sweep-results.json", analysis.model_dump_json(indent=2))
    (out / "sweep.md").write_text(table(analysis))
    (out / "recommended-values.yaml").write_text(recommended_values(analysis, results))
    plots.draw(results, out)
    return analysis
