"""The run's Markdown table and acceptance plot; compare several runs side by side."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dflash_ops.bench.core import slo
from dflash_ops.bench.core.results import BenchResult, LevelResult, Percentiles


def _fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _pct(p: Percentiles | None, *keys: str) -> str:
    """e.g. `41 / 58 (n=24)`: the sample count beside every percentile."""
    if p is None:
        return "n/a"
    return " / ".join(f"{getattr(p, k):.0f}" for k in keys) + f" (n={p.count})"


STATUS_LINES = {
    "running": "**Running**: the levels below are those finished so far.",
    "interrupted": "**Interrupted**: the run was stopped; the levels below are what it measured.",
    "failed": "**Stopped early**: the levels below are what was measured before it stopped.",
    "died": "**Died**: its process ended without a word (kill -9, a crash, the machine); the "
    "levels below are what it had written.",
}


def markdown(result: BenchResult) -> str:
    s = result.settings
    lines = [
        f"# Benchmark: {result.model} at {result.base_url}",
        "",
        f"Prompt set `{s.prompt_set}`, sampling: {s.sampling.describe()}; max_tokens "
        f"{s.max_tokens}, {s.length_described()}, "
        f"{s.repeats} run(s) per level after {s.warmup} warm-up request(s); streamed; started "
        f"{result.started_at}. Throughput is mean ± stdev (min-max) over the runs; latencies in "
        "ms over every request of the level (interpolated percentiles, n = samples). ITL is the "
        "gap between streamed chunks: one chunk per engine step, so with speculative decoding "
        "it is per step, not per token.",
        "",
        "| level | requests ok/failed | output tok/s | req/s | TTFT p50 / p99 | TPOT p50 / p99 "
        "| ITL p50 / p99 | mean acceptance length | draft acceptance rate | per-position "
        "acceptance | prefix-cache hit rate |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    if result.status in STATUS_LINES:
        reason = f" Reason: {result.stop_reason}" if result.stop_reason else ""
        lines[2:2] = [STATUS_LINES[result.status] + reason, ""]
    for level in result.levels:
        spec = level.spec_decode
        per_pos = ", ".join(f"{p:.2f}" for p in spec.per_position_acceptance) if spec else "n/a"
        tps = level.output_tokens_per_s
        ok = sum(r.requests for r in level.runs)
        failed = sum(r.failed for r in level.runs)
        hit = level.prefix_cache.hit_rate if level.prefix_cache else None
        lines.append(
            f"| {level.label}{' (partial)' if level.partial else ''} | {ok}/{failed} | "
            f"{tps.mean:.1f} ± {tps.stdev:.1f} "
            f"({tps.min:.1f}-{tps.max:.1f}) | {level.requests_per_s.mean:.2f} | "
            f"{_pct(level.ttft_ms, 'p50', 'p99')} | {_pct(level.tpot_ms, 'p50', 'p99')} | "
            f"{_pct(level.itl_ms, 'p50', 'p99')} | "
            f"{_fmt(spec.mean_acceptance_length if spec else None)} | "
            f"{_fmt(spec.draft_acceptance_rate if spec else None, 3)} | {per_pos} | "
            f"{_fmt(hit, 3)} |"
        )
    if result.kv_cache_tokens is not None:
        lines += [
            "",
            f"KV-cache capacity reported by the engine: {result.kv_cache_tokens:,} tokens.",
        ]
    if result.lossless is not None:
        check = result.lossless
        verdict = "PASS" if check.passed else "FAIL"
        levels = ", ".join(str(c) for c in check.concurrency)
        lines += [
            "",
            f"Losslessness vs {check.reference_url} at concurrency {levels}: {verdict}, "
            f"{check.identical}/{check.prompts} greedy outputs token-identical.",
        ]
        lines += [f"- {m}" for m in check.mismatches]
    for sampled in result.sampled_lossless or []:
        lines += ["", f"Sampled losslessness: {sampled.summary()}."]
        lines += [
            f"- {f.prompt}, position {f.position} (adjusted p {f.adjusted_p:.3g}): {f.detail}"
            for f in sampled.findings
        ]
    if s.goodput:
        lines += ["", f"Goodput objectives: {slo.describe(s.goodput)}.", ""]
        lines += ["| level | goodput req/s | requests meeting every objective |", "|---|---:|---:|"]
        for level in result.levels:
            good = level.goodput_requests_per_s
            share = level.slo_attainment
            lines.append(
                f"| {level.label} | {_fmt(good.mean if good else None)} | "
                f"{'n/a' if share is None else f'{share:.1%}'} |"
            )
    lines += _categories(result)
    if s.metrics_urls:
        lines += ["", f"Counters read from {len(s.metrics_urls)} engine(s): "
                  f"{', '.join(s.metrics_urls)}."]  # fmt: skip
        for level in result.levels:
            if level.engines_unread:
                lines.append(
                    f"- {level.label}: summed over {', '.join(level.engines_counted) or 'none'}; "
                    f"left out, its /metrics unread at some snapshot: "
                    f"{', '.join(level.engines_unread)}"
                )
        for level in result.levels:
            if level.replica_share:
                shares = ", ".join(f"{url} {v:.0%}" for url, v in level.replica_share.items())
                lines.append(f"- {level.label}: requests finished per engine: {shares}")
    for level in result.levels:
        if level.partial:
            lines.append(f"- {level.label}: stopped early: {level.partial}")
        if level.failures:
            kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(level.failures.items()))
            lines.append(f"- {level.label}: failed requests by kind: {kinds}")
        lines += [f"- {level.label}: failed request: {e}" for e in level.errors]
        lines += [f"- {level.label}: {note}" for note in level.notes]
        if level.token_count_source == "tokenizer":
            lines.append(
                f"- {level.label}: the server sent no usage chunk; output tokens were counted "
                f"with the tokenizer {s.tokenizer}"
            )
    lines += ["", *(f"Note: {n}" for n in result.notes)] if result.notes else []
    return "\n".join(lines) + "\n"


def _categories(result: BenchResult) -> list[str]:
    """Per prompt category (spec_bench): tokens per streamed step, the acceptance length as the
    stream shows it (the /metrics counters are one total for all categories)."""
    levels = [level for level in result.levels if level.categories]
    if not levels:
        return []
    lines = [
        "",
        "Per category, from the stream: output tokens per engine step after the first token "
        "(1 + accepted draft tokens; 1.00 without speculation) and mean TPOT.",
        "",
        "| level | category | requests | tokens per step | TPOT mean (ms) |",
        "|---|---|---:|---:|---:|",
    ]
    for level in levels:
        for name, figures in (level.categories or {}).items():
            lines.append(
                f"| {level.label} | {name} | {figures.requests} | "
                f"{_fmt(figures.tokens_per_step)} | {_fmt(figures.tpot_ms_mean)} |"
            )
    return lines


def curve_groups(result: BenchResult, tolerance: float = 0.02) -> list[tuple[str, list[float]]]:
    """Per-position curves with the levels that share one merged into one label: greedy
    decoding gives the same curve at every concurrency, drawn once, not once per level."""
    groups: list[tuple[list[str], list[float]]] = []
    for level in result.levels:
        spec = level.spec_decode
        if not spec or not spec.per_position_acceptance:
            continue
        curve = spec.per_position_acceptance
        for labels, seen in groups:
            if len(seen) == len(curve) and all(
                abs(a - b) <= tolerance for a, b in zip(seen, curve, strict=True)
            ):
                labels.append(level.label)
                break
        else:
            groups.append(([level.label], curve))
    return [(" = ".join(labels), curve) for labels, curve in groups]


def plot(result: BenchResult, path: Path) -> None:
    """Per-position acceptance (one curve per distinct curve) beside throughput per level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, tput) = plt.subplots(1, 2, figsize=(11, 4), dpi=110)
    groups = curve_groups(result)
    for label, curve in groups:
        ax.plot(range(len(curve)), curve, marker="o", label=label)
    widest = max((len(curve) for _, curve in groups), default=0)
    ax.set_xticks(range(widest))
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted / drafts")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"Per-position acceptance: {result.model}")
    if groups:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no speculative-decoding counters", ha="center", transform=ax.transAxes)
    ax.grid(alpha=0.3)
    labels = [level.label for level in result.levels]
    means = [level.output_tokens_per_s.mean for level in result.levels]
    spread = [level.output_tokens_per_s.stdev for level in result.levels]
    tput.bar(range(len(labels)), means, yerr=spread, capsize=4, color="tab:blue")
    tput.set_xticks(range(len(labels)))
    tput.set_xticklabels(labels, rotation=15, fontsize=8)
    tput.set_ylabel("output tokens/s (mean ± stdev)")
    tput.set_title("Throughput per level")
    tput.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


class DifferentWorkloads(ValueError):
    """The runs measured different workloads (the requests or their sampling)."""


def workload_differences(runs: list[tuple[str, BenchResult]]) -> dict[str, list[str]]:
    """Each workload aspect (BenchSettings.workload) on which the runs differ: its value per
    run, in the runs' order."""
    workloads = [result.settings.workload() for _, result in runs]
    return {
        aspect: [w[aspect] for w in workloads]
        for aspect in workloads[0]
        if len({w[aspect] for w in workloads}) > 1
    }


def compare(runs: list[tuple[str, BenchResult]], different_workloads: bool = False) -> str:
    """One table of several runs, per load level they all share, with each run's ratio to the
    first (the baseline). Raises ValueError when they share no level, DifferentWorkloads when
    they measured different workloads, unless `different_workloads` (then each run whose
    workload differs from the baseline's is marked, and the differences listed)."""
    differences = workload_differences(runs)
    if differences and not different_workloads:
        aspect, per_run = next(iter(differences.items()))
        which = "; ".join(
            f"{name}: {value}" for (name, _), value in zip(runs, per_run, strict=True)
        )
        raise DifferentWorkloads(
            f"the runs measured different workloads, so their ratios would mislead: {aspect} "
            f"differs ({which})" + (f", and {len(differences) - 1} more" if len(differences) > 1
                                    else "")
        )  # fmt: skip
    baseline = runs[0][1].settings.workload()
    names = [
        name + (" (*)" if result.settings.workload() != baseline else "") for name, result in runs
    ]
    by_label = [{level.label: level for level in result.levels} for _, result in runs]
    shared = [label for label in by_label[0] if all(label in other for other in by_label[1:])]
    if not shared:
        raise ValueError("the runs share no load level")
    header = " | ".join(names) + " | " + " | ".join(f"{n} / {names[0]}" for n in names[1:])
    lines = [
        f"| metric | level | {header} |",
        "|---|---|" + "---:|" * (2 * len(names) - 1),
    ]
    metrics: list[tuple[str, Callable[[LevelResult], float | None]]] = [
        ("output tok/s (mean)", lambda lv: lv.output_tokens_per_s.mean),
        ("TTFT p50 ms", lambda lv: lv.ttft_ms.p50 if lv.ttft_ms else None),
        ("TTFT p99 ms", lambda lv: lv.ttft_ms.p99 if lv.ttft_ms else None),
        ("TPOT p50 ms", lambda lv: lv.tpot_ms.p50 if lv.tpot_ms else None),
        ("TPOT p99 ms", lambda lv: lv.tpot_ms.p99 if lv.tpot_ms else None),
        ("mean acceptance length", _mal),
        ("k in effect", lambda lv: lv.spec_decode.k_in_effect if lv.spec_decode else None),
        (
            "draft acceptance rate",
            lambda lv: lv.spec_decode.draft_acceptance_rate if lv.spec_decode else None,
        ),
    ]
    for label in shared:
        levels = [table[label] for table in by_label]
        for name, of in metrics:
            values = [of(level) for level in levels]
            base = values[0]
            ratios = [f"{v / base:.2f}x" if base and v is not None else "n/a" for v in values[1:]]
            cells = " | ".join(_fmt(v) for v in values) + " | " + " | ".join(ratios)
            lines.append(f"| {name} | {label} | {cells} |")
    partial = [n for n, (_, r) in zip(names, runs, strict=True) if r.status != "complete"]
    if partial:
        lines += ["", f"Not complete (see their results.md): {', '.join(partial)}."]
    if differences:
        lines += ["", "(*) measured another workload than the baseline:"]
        lines += [
            f"- {aspect}: " + "; ".join(f"{n}: {v}" for n, v in zip(names, shown, strict=True))
            for aspect, shown in differences.items()
        ]
    else:
        lines += ["", f"Workload of every run: {runs[0][1].settings.sampling.describe()}."]
    return "\n".join(lines) + "\n"


def _mal(level: LevelResult) -> float | None:
    return level.spec_decode.mean_acceptance_length if level.spec_decode else None
