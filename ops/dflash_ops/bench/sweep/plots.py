"""The sweep's pictures, next to its results: throughput vs load with spread bars, TPOT and TTFT
p50/p99 vs load, per-position acceptance with one curve per k, the speed-up over `off`, and the
Pareto picture: output tok/s against TPOT p99 and TTFT p99, a curve per setting through its
load levels, the frontier of the points no other beats on both (the setting to run at an SLO)."""

from __future__ import annotations

from pathlib import Path

from dflash_ops.bench.core.results import BenchResult, LevelResult
from dflash_ops.bench.sweep.deployers import Setting


def _load(level: LevelResult) -> float:
    return float(level.concurrency if level.concurrency is not None else level.request_rate or 0)


def _axis_label(results: dict[Setting, BenchResult]) -> str:
    first = next(iter(results.values())).levels[0]
    return "concurrency" if first.concurrency is not None else "request rate (1/s)"


def draw(results: dict[Setting, BenchResult], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths: list[Path] = []
    x_label = _axis_label(results)
    ordered = sorted(results.items())
    loads = sorted({_load(lv) for result in results.values() for lv in result.levels})

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for setting, result in ordered:
        xs = [_load(lv) for lv in result.levels]
        ys = [lv.output_tokens_per_s.mean for lv in result.levels]
        errors = [lv.output_tokens_per_s.stdev for lv in result.levels]
        ax.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=setting.key)
    ax.set_xticks(loads)
    ax.set_xlabel(x_label)
    ax.set_ylabel("output tokens/s (mean ± stdev over runs)")
    ax.set_title("Throughput by setting")
    _finish(fig, ax, out / "throughput.png", paths)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), dpi=110)
    for ax, name, attr in ((axes[0], "TPOT", "tpot_ms"), (axes[1], "TTFT", "ttft_ms")):
        for setting, result in ordered:
            xs = [_load(lv) for lv in result.levels]
            p50 = [getattr(lv, attr).p50 if getattr(lv, attr) else None for lv in result.levels]
            p99 = [getattr(lv, attr).p99 if getattr(lv, attr) else None for lv in result.levels]
            line = ax.plot(xs, p50, marker="o", label=f"{setting.key} p50")[0]
            ax.plot(xs, p99, marker="^", linestyle="--", color=line.get_color(),
                    label=f"{setting.key} p99")  # fmt: skip
        ax.set_xticks(loads)
        ax.set_xlabel(x_label)
        ax.set_ylabel(f"{name} (ms)")
        ax.set_title(f"{name} p50 (solid) and p99 (dashed)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    _save(fig, out / "latency.png", paths)

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for setting, result in ordered:
        level = result.levels[0]  # greedy decoding: the curve barely moves with load
        spec = level.spec_decode
        if setting.k and spec and spec.per_position_acceptance:
            rates = spec.per_position_acceptance
            label = f"{setting.key} ({level.label})"
            ax.plot(range(1, len(rates) + 1), rates, marker="o", label=label)
    ax.set_xticks(range(1, max((s.k for s in results), default=0) + 1))
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted / drafts")
    ax.set_ylim(0, 1.05)
    ax.set_title("Per-position acceptance, one curve per k")
    _finish(fig, ax, out / "acceptance-by-k.png", paths)

    off = next((r for s, r in results.items() if s.k == 0), None)
    if off is not None:
        base = {lv.label: lv.output_tokens_per_s.mean for lv in off.levels}
        fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
        for setting, result in ordered:
            if setting.k == 0:
                continue
            pairs = [(_load(lv), lv.output_tokens_per_s.mean / base[lv.label])
                     for lv in result.levels if base.get(lv.label)]  # fmt: skip
            ax.plot([p[0] for p in pairs], [p[1] for p in pairs], marker="o", label=setting.key)
        ax.axhline(1.0, color="grey", linewidth=1)
        ax.set_xticks(loads)
        ax.set_xlabel(x_label)
        ax.set_ylabel("output tok/s / off")
        ax.set_title("Speed-up over no speculation")
        _finish(fig, ax, out / "speedup.png", paths)
    _draw_pareto(results, out, paths)
    return paths


def pareto_frontier(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (latency, throughput) points no other point beats on both (lower or equal latency
    and higher or equal throughput, one of them strictly), by rising latency."""
    frontier: list[tuple[float, float]] = []
    for latency, throughput in sorted(points, key=lambda p: (p[0], -p[1])):
        if not frontier or throughput > frontier[-1][1]:
            frontier.append((latency, throughput))
    return frontier


def _draw_pareto(results: dict[Setting, BenchResult], out: Path, paths: list[Path]) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    for ax, name, attr in ((axes[0], "TPOT", "tpot_ms"), (axes[1], "TTFT", "ttft_ms")):
        everything: list[tuple[float, float]] = []
        for setting, result in sorted(results.items()):
            points = [
                (getattr(lv, attr).p99, lv.output_tokens_per_s.mean, _load(lv))
                for lv in result.levels
                if getattr(lv, attr) is not None
            ]
            if not points:
                continue
            line = ax.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                           label=setting.key)[0]  # fmt: skip
            for latency, throughput, load in points:
                ax.annotate(
                    f"{load:g}",
                    (latency, throughput),
                    fontsize=6,
                    color=line.get_color(),
                    xytext=(3, 3),
                    textcoords="offset points",
                )
            everything += [(p[0], p[1]) for p in points]
        frontier = pareto_frontier(everything)
        if frontier:
            ax.step([p[0] for p in frontier], [p[1] for p in frontier], where="post",
                    color="black", linewidth=1, alpha=0.5, label="frontier")  # fmt: skip
        ax.set_xlabel(f"{name} p99 (ms)")
        ax.set_ylabel("output tokens/s (mean over runs)")
        ax.set_title(f"Throughput against {name} p99 (labels: load)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    _save(fig, out / "pareto.png", paths)


def _finish(fig: object, ax: object, path: Path, paths: list[Path]) -> None:
    ax.grid(alpha=0.3)  # type: ignore[attr-defined]
    ax.legend(fontsize=8)  # type: ignore[attr-defined]
    _save(fig, path, paths)


def _save(fig: object, path: Path, paths: list[Path]) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()  # type: ignore[attr-defined]
    fig.savefig(path)  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[arg-type]
    paths.append(path)
