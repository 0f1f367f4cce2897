"""What a sweep's measurements say: per load level, the fastest setting, the one with the
lowest TPOT p99, and the smallest k whose throughput is within the measured spread of the
fastest; and, per method, the acceptance length each smaller k would reach predicted from the
per-position acceptance at the largest k, beside what was measured."""

from __future__ import annotations

from dflash_sidecar.acceptance_window import acceptance_length_at
from pydantic import BaseModel, Field

from dflash_ops.bench.core.results import BenchResult, LevelResult
from dflash_ops.bench.sweep.deployers import Setting
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


class SweepAnalysis(BaseModel):
    points: list[PointFigures]
    recommendations: list[LevelRecommendation]
    predictions: list[Prediction]
    kv_cache_tokens: dict[int, int] = Field(
        default_factory=dict,
        description="the planner's KV-cache tokens per k for the chart's default deployment",
    )


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


def recommend(points: list[PointFigures]) -> list[LevelRecommendation]:
    levels = list(dict.fromkeys(p.level for p in points))
    out = []
    for label in levels:
        here = [p for p in points if p.level == label]
        fastest = max(here, key=lambda p: (p.output_tokens_per_s, -p.k))
        floor = fastest.output_tokens_per_s - fastest.output_tokens_per_s_stdev
        close = [p for p in here if p.output_tokens_per_s + p.output_tokens_per_s_stdev >= floor]
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


def analyse(results: dict[Setting, BenchResult], with_capacity: bool = True) -> SweepAnalysis:
    points = [figures(s, lv) for s, result in sorted(results.items()) for lv in result.levels]
    return SweepAnalysis(
        points=points,
        recommendations=recommend(points),
        predictions=predict(results),
        kv_cache_tokens=planned_kv_tokens([s.k for s in results]) if with_capacity else {},
    )


def recommended_values(analysis: SweepAnalysis, results: dict[Setting, BenchResult]) -> str:
    """The chart values for the recommendation at the highest measured load, as YAML with the
    other levels' picks in comments."""
    by_key = {s.key: s for s in results}
    picks = analysis.recommendations
    last = picks[-1]
    setting = by_key[last.recommended]
    lines = [
        "# dflash-serve bench sweep: the smallest k within the measured spread of the fastest",
        f"# setting at {last.level} (the highest load measured). Per level:",
        *(f"#   {r.level}: {r.recommended} (fastest {r.fastest})" for r in picks),
    ]
    if any(s.method == "draft_model" for s in results):
        lines.append(
            "# Measured on the CPU local stack, whose draft model stands in for DFlash2: "
            "re-run the sweep on the GPU cluster before production."
        )
    speculative: dict[str, object] = {"method": setting.chart_method}
    if setting.k:
        speculative["numSpeculativeTokens"] = setting.k
    import yaml

    body = yaml.safe_dump(
        {"speculative": speculative, "engine": {"blockSize": "auto"}}, sort_keys=False
    )
    return "\n".join(lines) + "\n" + body


def table(analysis: SweepAnalysis) -> str:
    lines = [
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
    return "\n".join(lines) + "\n"


def _fmt(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"
