"""Write results.json, results.md and acceptance.png; compare two runs side by side."""

from __future__ import annotations

from pathlib import Path

from dflash_ops.bench.results import BenchResult, LevelResult, Percentiles


def _fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _pct(p: Percentiles | None, *keys: str) -> str:
    if p is None:
        return "n/a"
    return " / ".join(f"{getattr(p, k):.0f}" for k in keys)


def markdown(result: BenchResult) -> str:
    s = result.settings
    length = f"{s.num_requests} requests" if s.num_requests else f"{s.duration_s:g} s of arrivals"
    lines = [
        f"# Benchmark: {result.model} at {result.base_url}",
        "",
        f"Prompt set `{s.prompt_set}`, greedy, max_tokens {s.max_tokens}, {length} per run, "
        f"{s.repeats} run(s) per level after {s.warmup} warm-up request(s); streamed; started "
        f"{result.started_at}. Throughput is mean ± stdev (min-max) over the runs; latencies in "
        "ms over every request of the level. ITL is the gap between streamed chunks: one chunk "
        "per engine step, so with speculative decoding it is per step, not per token.",
        "",
        "| level | requests ok/failed | output tok/s | req/s | TTFT p50 / p99 | TPOT p50 / p99 "
        "| ITL p50 / p99 | mean acceptance length | draft acceptance rate | per-position "
        "acceptance | prefix-cache hit rate |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for level in result.levels:
        spec = level.spec_decode
        per_pos = ", ".join(f"{p:.2f}" for p in spec.per_position_acceptance) if spec else "n/a"
        tps = level.output_tokens_per_s
        ok = sum(r.requests for r in level.runs)
        failed = sum(r.failed for r in level.runs)
        hit = level.prefix_cache.hit_rate if level.prefix_cache else None
        lines.append(
            f"| {level.label} | {ok}/{failed} | {tps.mean:.1f} ± {tps.stdev:.1f} "
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
    for level in result.levels:
        lines += [f"- {level.label}: failed request: {e}" for e in level.errors]
    lines += ["", *(f"Note: {n}" for n in result.notes)] if result.notes else []
    return "\n".join(lines) + "\n"


def plot(result: BenchResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    plotted = False
    for level in result.levels:
        spec = level.spec_decode
        if spec and spec.per_position_acceptance:
            positions = range(len(spec.per_position_acceptance))
            ax.plot(
                positions,
                spec.per_position_acceptance,
                marker="o",
                label=f"{level.label} (mean acceptance length {_fmt(spec.mean_acceptance_length)})",
            )
            plotted = True
    widest = max(
        (len(lv.spec_decode.per_position_acceptance) for lv in result.levels if lv.spec_decode),
        default=0,
    )
    ax.set_xticks(range(widest))
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted / drafts")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"Per-position acceptance: {result.model}")
    if plotted:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no speculative-decoding counters", ha="center", transform=ax.transAxes)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write(result: BenchResult, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.json", out / "results.md", out / "acceptance.png"]
    paths[0].write_text(result.model_dump_json(indent=2))
    paths[1].write_text(markdown(result))
    plot(result, paths[2])
    return paths


def compare(a: BenchResult, b: BenchResult, a_name: str, b_name: str) -> str:
    """Side-by-side table of two runs with B/A ratios, per shared level."""
    lines = [
        f"| metric | level | {a_name} | {b_name} | {b_name} / {a_name} |",
        "|---|---|---:|---:|---:|",
    ]
    levels_a = {level.label: level for level in a.levels}
    levels_b = {level.label: level for level in b.levels}
    shared = [label for label in levels_a if label in levels_b]
    if not shared:
        return "the two runs share no load level\n"

    def p50(p: Percentiles | None) -> float | None:
        return None if p is None else p.p50

    for label in shared:
        la, lb = levels_a[label], levels_b[label]
        rows: list[tuple[str, float | None, float | None]] = [
            ("output tok/s (mean)", la.output_tokens_per_s.mean, lb.output_tokens_per_s.mean),
            (
                "mean acceptance length",
                _mal(la),
                _mal(lb),
            ),
            ("TTFT p50 ms", p50(la.ttft_ms), p50(lb.ttft_ms)),
            ("TPOT p50 ms", p50(la.tpot_ms), p50(lb.tpot_ms)),
        ]
        for name, va, vb in rows:
            ratio = f"{vb / va:.2f}x" if va and vb is not None else "n/a"
            lines.append(f"| {name} | {label} | {_fmt(va)} | {_fmt(vb)} | {ratio} |")
    return "\n".join(lines) + "\n"


def _mal(level: LevelResult) -> float | None:
    return level.spec_decode.mean_acceptance_length if level.spec_decode else None
