"""What a sweep's measurements say: per load level, the fastest setting, the one with the
lowest TPOT p99, and the smallest k whose throughput is within the measured spread of the
fastest; and, per method, the acceptance length each smaller k would reach predicted from the
per-position acceptance at the largest k, beside what was measured."""

from __future__ import annotations

from dflash_sidecar.acceptance_window import acceptance_length_at
from dflash_sidecar.baseline import Baseline
from pydantic import BaseModel, Field

from dflash_ops.bench.core.baseline import baseline_of
from dflash_ops.bench.core.results import BenchResult, LevelResult, requests_described
from dflash_ops.bench.sweep.deployers import Setting
from dflash_ops.bench.sweep.live_predictions import LiveComparison
from dflash_ops.bench.sweep.live_predictions import table as live_table
from dflash_ops.bench.sweep.step_cost_fit import fit_step_cost, step_points
from dflash_ops.errors import UserError
from dflash_ops.vocabulary import SpeculativeMethod


class PointFigures(BaseModel):
    key: str
    method: SpeculativeMethod
    k: int
    level: str
    output_tokens_per_s: float
    output_tokens_per_s_stdev: float
    tpot_p99_ms: float | None
    ttft_p99_ms: float | None
    mean_acceptance_length: float | None


class LevelRecommendation(BaseModel):
    level: str
    fastest: str = Field(description="highest mean output tok/s")
    lowest_tpot_p99: str | None
    recommended: str = Field(
        description="the smallest k whose mean output tok/s is within the spread of the fastest "
        "(mean + stdev reaches the fastest's mean - stdev): fewer KV blocks per request"
    )
    within_spread: list[str]


class Prediction(BaseModel):
    method: SpeculativeMethod
    from_k: int
    level: str
    k: int
    predicted_mean_acceptance_length: float
    measured_mean_acceptance_length: float | None


class ScheduleLevel(BaseModel):
    level: str
    output_tokens_per_s: float
    output_tokens_per_s_stdev: float
    best_static: str = Field(description="the fastest static setting at this level")
    best_static_tokens_per_s: float
    best_static_stdev: float
    ratio: float = Field(description="the schedule's mean output tok/s over the best static's")
    within_spread: bool = Field(
        description="the schedule's mean + stdev reaches the best static's mean - stdev"
    )
    ahead_of: list[str] = Field(
        description="static settings the schedule beats here beyond both spreads"
    )


class ScheduleVerdict(BaseModel):
    """The schedule run as one more setting, against the best static setting at every level."""

    schedule: str
    setting: str
    levels: list[ScheduleLevel]
    recommended: bool = Field(description="within the spread of the best static at every level")
    shortfalls: list[str] = Field(description="where it fell short, and by how much")
    never_ahead_of: list[str] = Field(
        description="static settings the schedule beats beyond the spread at no level"
    )


class SweepAnalysis(BaseModel):
    points: list[PointFigures]
    recommendations: list[LevelRecommendation] = Field(
        description="among the static settings (one k each)"
    )
    predictions: list[Prediction]
    kv_cache_tokens: dict[int, int] = Field(
        default_factory=dict,
        description="the planner's KV-cache tokens per k for the chart's default deployment",
    )
    schedule: ScheduleVerdict | None = None
    schedule_note: str | None = Field(
        default=None, description="why no schedule was run, when none was"
    )
    schedule_derivation: str | None = Field(
        default=None, description="the measurements a derived schedule came from"
    )
    workload: dict[str, str] = Field(
        default_factory=dict,
        description="what every setting was measured under: the requests and their sampling "
        "(BenchSettings.workload); the recommendation holds for this workload",
    )
    live_predictions: LiveComparison | None = Field(
        default=None,
        description="with --step-cost-from: the sidecar's live predictions of every k at each "
        "level against the measurements",
    )

    def measured_under(self) -> str:
        """One line: the sampling first, then the requests."""
        if not self.workload:
            return "an unrecorded workload"
        sampling = self.workload.get("sampling", "unrecorded")
        return f"sampling {sampling}; {requests_described(self.workload)}"


def figures(setting: Setting, level: LevelResult) -> PointFigures:
    spec = level.spec_decode
    return PointFigures(
        key=setting.key,
        method=setting.method,
        k=setting.k,
        level=level.label,
        output_tokens_per_s=level.output_tokens_per_s.mean,
        output_tokens_per_s_stdev=level.output_tokens_per_s.stdev,
        tpot_p99_ms=level.tpot_ms.p99 if level.tpot_ms else None,
        ttft_p99_ms=level.ttft_ms.p99 if level.ttft_ms else None,
        mean_acceptance_length=spec.mean_acceptance_length if spec else None,
    )


# The spread rule, the one the static recommendation and the schedule's verdict share: a point's
# mean output tok/s plus its stdev against another's mean minus its stdev.


def fastest_of(points: list[PointFigures]) -> PointFigures:
    """The highest mean output tok/s; a tie goes to the smaller k."""
    return max(points, key=lambda p: (p.output_tokens_per_s, -p.k))


# What the spread is, and what it is not (choosing-k.md: on a shared 2-core CPU machine, one
# setting's figure moved 1.1-1.45x between engine starts within 45 minutes, each start's repeats
# within 1-3%).
SPREAD_NOTE = (
    "(± is the spread of the repeats within one engine start per setting, not between starts, "
    "which can differ by more: a pick decided within a few percent is worth a second sweep.)"
)


def within_spread(point: PointFigures, best: PointFigures) -> bool:
    """`point`'s mean + stdev reaches `best`'s mean - stdev: the two cannot be told apart."""
    return (
        point.output_tokens_per_s + point.output_tokens_per_s_stdev
        >= best.output_tokens_per_s - best.output_tokens_per_s_stdev
    )


def ahead_beyond_spread(point: PointFigures, other: PointFigures) -> bool:
    """`point`'s mean - stdev is above `other`'s mean + stdev: ahead beyond both spreads."""
    return (
        point.output_tokens_per_s - point.output_tokens_per_s_stdev
        > other.output_tokens_per_s + other.output_tokens_per_s_stdev
    )


def recommend(points: list[PointFigures]) -> list[LevelRecommendation]:
    levels = list(dict.fromkeys(p.level for p in points))
    out = []
    for label in levels:
        here = [p for p in points if p.level == label]
        fastest = fastest_of(here)
        close = [p for p in here if within_spread(p, fastest)]
        # Ties go to the smaller k (fewer KV blocks per request: more requests fit).
        pick = min(close, key=lambda p: (p.k, -p.output_tokens_per_s))
        with_tpot = [p for p in here if p.tpot_p99_ms is not None]
        lowest = min(with_tpot, key=lambda p: (p.tpot_p99_ms, p.k)) if with_tpot else None
        out.append(
            LevelRecommendation(
                level=label,
                fastest=fastest.key,
                lowest_tpot_p99=lowest.key if lowest else None,
                recommended=pick.key,
                within_spread=[p.key for p in sorted(close, key=lambda p: p.k)],
            )
        )
    return out


def predict(results: dict[Setting, BenchResult]) -> list[Prediction]:
    """1 + the sum of the first k' per-position rates at the largest k, for each smaller k'."""
    out = []
    for method in sorted({s.method for s in results if s.k > 0}):
        settings = sorted(s for s in results if s.method == method and s.k > 0)
        if len(settings) < 2:
            continue
        largest = settings[-1]
        measured_levels = {s: {lv.label: lv for lv in results[s].levels} for s in settings}
        for level in results[largest].levels:
            spec = level.spec_decode
            if spec is None or len(spec.per_position_acceptance) < largest.k:
                continue
            rates = spec.per_position_acceptance
            for smaller in settings[:-1]:
                other = measured_levels[smaller].get(level.label)
                other_spec = other.spec_decode if other else None
                out.append(
                    Prediction(
                        method=method,
                        from_k=largest.k,
                        level=level.label,
                        k=smaller.k,
                        predicted_mean_acceptance_length=acceptance_length_at(rates, smaller.k),
                        measured_mean_acceptance_length=(
                            other_spec.mean_acceptance_length if other_spec else None
                        ),
                    )
                )
    return out


def planned_kv_tokens(ks: list[int]) -> dict[int, int]:
    """KV-cache tokens per k the planner gives for the chart's default deployment (A100, TP2,
    DFlash2 draft, the reference checkpoint), closed form: what a larger k costs."""
    from dflash_ops.plan.checkpoint import load_checkpoint
    from dflash_ops.plan.planner import make_plan

    wanted = sorted({k for k in ks if k > 0})
    if not wanted:
        return {}
    plan = make_plan(load_checkpoint(), gpu="a100", tp=2, ks=wanted, engine="closed-form")
    return {k: plan.capacity[k].kv_cache_tokens for k in wanted if k in plan.capacity}


def analyse(
    results: dict[Setting, BenchResult],
    with_capacity: bool = True,
    schedule_note: str | None = None,
    schedule_derivation: str | None = None,
) -> SweepAnalysis:
    """Recommendations and predictions over the static settings; a schedule setting among
    `results` is verified against them."""
    static = {s: r for s, r in results.items() if s.schedule is None}
    points = [figures(s, lv) for s, result in sorted(results.items()) for lv in result.levels]
    static_points = [p for p in points if p.key in {s.key for s in static}]
    scheduled = [s for s in results if s.schedule is not None]
    verdict = None
    if scheduled:
        setting = scheduled[0]
        verdict = verify_schedule(
            setting, [p for p in points if p.key == setting.key], static_points
        )
    return SweepAnalysis(
        points=points,
        recommendations=recommend(static_points),
        predictions=predict(static),
        kv_cache_tokens=planned_kv_tokens([s.k for s in static]) if with_capacity else {},
        schedule=verdict,
        schedule_note=schedule_note,
        schedule_derivation=schedule_derivation,
        workload=next(iter(results.values())).settings.workload() if results else {},
    )


def verify_schedule(
    setting: Setting, scheduled: list[PointFigures], static: list[PointFigures]
) -> ScheduleVerdict:
    """The schedule is recommended only where, at every level, its throughput is within the
    measured spread of the best static setting there (the rule the static recommendation uses);
    otherwise the verdict says where and by how much it fell short."""
    levels = []
    for point in scheduled:
        here = [p for p in static if p.level == point.level]
        if not here:
            continue
        best = fastest_of(here)
        levels.append(
            ScheduleLevel(
                level=point.level,
                output_tokens_per_s=point.output_tokens_per_s,
                output_tokens_per_s_stdev=point.output_tokens_per_s_stdev,
                best_static=best.key,
                best_static_tokens_per_s=best.output_tokens_per_s,
                best_static_stdev=best.output_tokens_per_s_stdev,
                ratio=point.output_tokens_per_s / best.output_tokens_per_s
                if best.output_tokens_per_s
                else 0.0,
                within_spread=within_spread(point, best),
                ahead_of=[p.key for p in here if ahead_beyond_spread(point, p)],
            )
        )
    shortfalls = [
        f"{lv.level}: {lv.ratio:.2f}x of {lv.best_static} ({lv.output_tokens_per_s:.1f} ± "
        f"{lv.output_tokens_per_s_stdev:.1f} against {lv.best_static_tokens_per_s:.1f} ± "
        f"{lv.best_static_stdev:.1f} tok/s)"
        for lv in levels
        if not lv.within_spread
    ]
    keys = list(dict.fromkeys(p.key for p in static))
    ahead = {key for lv in levels for key in lv.ahead_of}
    return ScheduleVerdict(
        schedule=setting.schedule_text,
        setting=setting.key,
        levels=levels,
        recommended=bool(levels) and not shortfalls,
        shortfalls=shortfalls,
        never_ahead_of=[key for key in keys if key not in ahead],
    )


def recommended_setting(analysis: SweepAnalysis, results: dict[Setting, BenchResult]) -> Setting:
    """The verified schedule's setting, or else the recommendation at the highest load."""
    by_key = {s.key: s for s in results}
    verdict = analysis.schedule
    if verdict is not None and verdict.recommended:
        return by_key[verdict.setting]
    return by_key[analysis.recommendations[-1].recommended]


def sweep_baseline(analysis: SweepAnalysis, results: dict[Setting, BenchResult]) -> Baseline | None:
    """The acceptance at the recommended setting's largest k, from the static setting at that k
    (a schedule's own run drafts lowered k's), as the sidecar's baseline; None when the
    recommendation is no speculation or that static setting was not measured."""
    setting = recommended_setting(analysis, results)
    static = next(
        (
            s
            for s in results
            if s.schedule is None and s.k == setting.k and s.method == setting.method
        ),
        None,
    )
    if setting.k == 0 or static is None:
        return None
    try:
        baseline = baseline_of(results[static], f"bench sweep, {static.key}")
    except UserError:  # a server that exports no acceptance: nothing to judge against
        return None
    # Per-position figures for another k than the setting's: not this setting's engine.
    if baseline.num_speculative_tokens != static.k:
        return None
    try:
        step_cost = fit_step_cost(step_points(results))
    except UserError:  # one load only: the sidecar recommends no schedule from this sweep
        return baseline
    return baseline.model_copy(update={"step_cost": step_cost})


def recommended_values(
    analysis: SweepAnalysis,
    results: dict[Setting, BenchResult],
    baseline: Baseline | None = None,
    baseline_in_values: bool = True,
) -> str:
    """The chart values for the verified schedule, or else for the recommendation at the
    highest measured load, as YAML with the other levels' picks in comments. With `baseline`:
    sidecar.baseline too (the verdict then judges against this traffic), or, unless
    `baseline_in_values`, a comment naming baseline.yaml, where the sweep writes it."""
    setting = recommended_setting(analysis, results)
    picks = analysis.recommendations
    last = picks[-1]
    verdict = analysis.schedule
    if verdict is not None and verdict.recommended:
        lines = [
            f"# dflash-serve bench sweep: the k schedule {verdict.schedule}, within the measured",
            "# spread of the best static setting at every level. Per level (best static):",
            *(f"#   {lv.level}: {lv.ratio:.2f}x of {lv.best_static}" for lv in verdict.levels),
        ]
    else:
        lines = [
            "# dflash-serve bench sweep: the smallest k within the measured spread of the fastest",
            f"# setting at {last.level} (the highest load measured). Per level:",
            *(f"#   {r.level}: {r.recommended} (fastest {r.fastest})" for r in picks),
        ]
        if verdict is not None:
            lines.append(
                f"# The k schedule {verdict.schedule} is not recommended: it fell short at "
                + "; ".join(verdict.shortfalls)
            )
        elif analysis.schedule_note:
            lines.append(f"# No k schedule: {analysis.schedule_note}")
    lines.append(f"# Measured under {analysis.measured_under()}: choose k under your traffic's.")
    if any(s.method == "draft_model" for s in results):
        lines.append(
            "# Measured on the CPU local stack, whose draft model stands in for DFlash2: "
            "re-run the sweep on the GPU cluster before production."
        )
    import yaml

    values: dict[str, object] = {
        "speculative": setting.chart_values(),
        "engine": {"blockSize": "auto"},
    }
    if baseline is not None and baseline_in_values:
        lines.append(
            "# sidecar.baseline: the acceptance measured here; the verdict and the collapse alert "
            "judge against it."
        )
        values["sidecar"] = {"baseline": baseline.model_dump(mode="json", exclude_none=True)}
        if baseline.step_cost is not None:
            cost = baseline.step_cost
            lines.append(
                f"# sidecar.baseline.step_cost: the step time fitted from {cost.points} of these "
                f"measurements (throughput error {cost.fit_error_rms:.1%} rms, "
                f"{cost.fit_error_max:.1%} max); GET /recommendation predicts with it."
            )
    elif baseline is not None:
        lines.append(
            "# The sidecar's baseline for this traffic: baseline.yaml (local up --baseline)."
        )
    body = yaml.safe_dump(values, sort_keys=False)
    return "\n".join(lines) + "\n" + body


def table(analysis: SweepAnalysis) -> str:
    lines = [
        f"Measured under {analysis.measured_under()}.",
        "",
        "| setting | level | output tok/s | TPOT p99 ms | TTFT p99 ms | mean acceptance length "
        "| planned KV tokens (A100 TP2) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for p in analysis.points:
        kv = analysis.kv_cache_tokens.get(p.k)
        lines.append(
            f"| {p.key} | {p.level} | {p.output_tokens_per_s:.1f} ± "
            f"{p.output_tokens_per_s_stdev:.1f} | {_fmt(p.tpot_p99_ms, 1)} | "
            f"{_fmt(p.ttft_p99_ms, 0)} | {_fmt(p.mean_acceptance_length, 2)} | "
            f"{'n/a' if kv is None else f'{kv:,}'} |"
        )
    lines += ["", "| level | recommended | fastest | lowest TPOT p99 | within the spread |"]
    lines += ["|---|---|---|---|---|"]
    for r in analysis.recommendations:
        lines.append(
            f"| {r.level} | **{r.recommended}** | {r.fastest} | {r.lowest_tpot_p99 or 'n/a'} | "
            f"{', '.join(r.within_spread)} |"
        )
    lines += ["", SPREAD_NOTE]
    lines += schedule_table(analysis)
    if analysis.predictions:
        lines += [
            "",
            "| method | level | k | predicted mean acceptance length (from k=K) | measured |",
            "|---|---|---:|---:|---:|",
        ]
        for pr in analysis.predictions:
            lines.append(
                f"| {pr.method} | {pr.level} | {pr.k} | {pr.predicted_mean_acceptance_length:.2f} "
                f"(k={pr.from_k}) | {_fmt(pr.measured_mean_acceptance_length, 2)} |"
            )
    if analysis.live_predictions is not None:
        lines += ["", live_table(analysis.live_predictions).rstrip()]
    return "\n".join(lines) + "\n"


def schedule_table(analysis: SweepAnalysis) -> list[str]:
    verdict = analysis.schedule
    if verdict is None:
        return ["", f"No k schedule: {analysis.schedule_note}"] if analysis.schedule_note else []
    lines = [
        "",
        f"k schedule `{verdict.schedule}` ({verdict.setting}) against the best static setting:",
        *([f"({analysis.schedule_derivation})"] if analysis.schedule_derivation else []),
        "",
        "| level | schedule tok/s | best static | its tok/s | ratio | within the spread | "
        "ahead of |",
        "|---|---:|---|---:|---:|---|---|",
    ]
    for lv in verdict.levels:
        lines.append(
            f"| {lv.level} | {lv.output_tokens_per_s:.1f} ± {lv.output_tokens_per_s_stdev:.1f} | "
            f"{lv.best_static} | {lv.best_static_tokens_per_s:.1f} ± {lv.best_static_stdev:.1f} "
            f"| {lv.ratio:.2f}x | {'yes' if lv.within_spread else '**no**'} | "
            f"{', '.join(lv.ahead_of) or '-'} |"
        )
    if verdict.never_ahead_of:
        never = ", ".join(verdict.never_ahead_of)
        lines += ["", f"Never ahead beyond the spread of: {never}."]
    else:
        lines += ["", "Ahead of every static setting beyond the spread at one level at least."]
    if verdict.recommended:
        lines += ["", "**Recommended**: within the spread of the best static k at every level."]
    else:
        lines += ["", "Not recommended: fell short at " + "; ".join(verdict.shortfalls) + "."]
    return lines


def _fmt(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"
