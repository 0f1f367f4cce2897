"""Write results.json, results.md and acceptance.png; compare two runs side by side."""

from __future__ import annotations

from pathlib import Path

from dflash_ops.bench.results import BenchResult, RunResult


def _fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def markdown(result: BenchResult) -> str:
    lines = [
        f"# Benchmark: {result.model} at {result.base_url}",
        "",
        f"{len(result.prompt_set)} fixed prompts, greedy, max_tokens {result.max_tokens}, "
        f"warm-up excluded; started {result.started_at}.",
        "",
        "| concurrency | requests | output tok/s | mean acceptance length | draft acceptance rate "
        "| per-position acceptance | p50 latency s |",
        "|---:|---:|---:|---:|---:|---|---:|",
    ]
    for run in result.runs:
        spec = run.spec_decode
        per_pos = ", ".join(f"{p:.2f}" for p in spec.per_position_acceptance) if spec else "n/a"
        lines.append(
            f"| {run.concurrency} | {run.requests} | {run.output_tokens_per_s:.1f} | "
            f"{_fmt(spec.mean_acceptance_length if spec else None)} | "
            f"{_fmt(spec.draft_acceptance_rate if spec else None, 3)} | {per_pos} | "
            f"{run.latency.p50_s:.2f} |"
        )
    if result.kv_cache_tokens is not None:
        lines += [
            "",
            f"KV-cache capacity reported by the engine: {result.kv_cache_tokens:,} tokens.",
        ]
    if result.lossless is not None:
        check = result.lossless
        verdict = "PASS" if check.passed else "FAIL"
        lines += [
            "",
            f"Losslessness vs {check.reference_url}: {verdict}, {check.identical}/{check.prompts} "
            "greedy outputs token-identical.",
        ]
        lines += [f"- {m}" for m in check.mismatches]
    lines += ["", *(f"Note: {n}" for n in result.notes)] if result.notes else []
    return "\n".join(lines) + "\n"


def plot(result: BenchResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    plotted = False
    for run in result.runs:
        spec = run.spec_decode
        if spec and spec.per_position_acceptance:
            positions = range(len(spec.per_position_acceptance))
            ax.plot(
                positions,
                spec.per_position_acceptance,
                marker="o",
                label=f"concurrency {run.concurrency} "
                f"(mean acceptance length {_fmt(spec.mean_acceptance_length)})",
            )
            plotted = True
    widest = max(
        (len(r.spec_decode.per_position_acceptance) for r in result.runs if r.spec_decode),
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


def _by_concurrency(result: BenchResult) -> dict[int, RunResult]:
    return {run.concurrency: run for run in result.runs}


def compare(a: BenchResult, b: BenchResult, a_name: str, b_name: str) -> str:
    """Side-by-side table of two runs with B/A ratios, per shared concurrency."""
    lines = [
        f"| metric | concurrency | {a_name} | {b_name} | {b_name} / {a_name} |",
        "|---|---:|---:|---:|---:|",
    ]
    runs_a, runs_b = _by_concurrency(a), _by_concurrency(b)
    shared = sorted(set(runs_a) & set(runs_b))
    if not shared:
        return "the two runs share no concurrency level\n"
    for c in shared:
        ra, rb = runs_a[c], runs_b[c]
        rows: list[tuple[str, float | None, float | None]] = [
            ("output tok/s", ra.output_tokens_per_s, rb.output_tokens_per_s),
            (
                "mean acceptance length",
                ra.spec_decode.mean_acceptance_length if ra.spec_decode else None,
                rb.spec_decode.mean_acceptance_length if rb.spec_decode else None,
            ),
            ("p50 latency s", ra.latency.p50_s, rb.latency.p50_s),
        ]
        for name, va, vb in rows:
            ratio = f"{vb / va:.2f}x" if va and vb is not None else "n/a"
            lines.append(f"| {name} | {c} | {_fmt(va)} | {_fmt(vb)} | {ratio} |")
    return "\n".join(lines) + "\n"
