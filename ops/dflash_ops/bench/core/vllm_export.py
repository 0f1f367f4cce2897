"""A run in `vllm bench serve`'s result format, which vLLM's own tooling reads (`vllm bench sweep
plot` and `plot_pareto`, dashboards fed by its JSON):

- `OUT/vllm/<level>/run=N.json`, one per pass, and `OUT/vllm/<level>/summary.json` (the list of
  them): the layout of `vllm bench sweep`, so its plotting commands read OUT (or a sweep folder of
  such runs) as they read their own;
- with `--save-result`, one file per level pooled over its passes, named as vLLM names it
  (`--result-filename` for a run of one level).

Each record is computed from this run's own per-request lines, as vLLM's `calculate_metrics`
computes it: means, medians, population standard deviations and linearly interpolated
percentiles (numpy's default) of TTFT, TPOT (requests of two tokens or more), ITL (every gap
between streamed chunks) and E2EL, in ms, for `--percentile-metrics` at `--metric-percentiles`;
throughputs over the pass's wall time; the speculative-decoding counters of the pass as vLLM
names them. `--metadata` pairs and `--label` are kept as vLLM keeps them (top-level keys)."""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from dflash_ops.bench.core.atomic_files import replace_text
from dflash_ops.bench.core.results import BenchResult, LevelResult, RunResult

PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
DEFAULT_PERCENTILE_METRICS = ("ttft", "tpot", "itl")  # vLLM's for generative models
FOLDER = "vllm"


def backend_of(endpoint: str) -> str:
    """vllm bench serve's --backend for the API: openai (completions) or openai-chat."""
    return "openai" if endpoint == "/v1/completions" else "openai-chat"


def percentile(values: Sequence[float], p: float) -> float:
    """numpy.percentile's default (linear interpolation between closest ranks)."""
    ordered = sorted(values)
    position = p / 100 * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def level_name(level: LevelResult) -> str:
    """A folder name for a level: `concurrency=4`, `rate=2.5`, `rate=2.5-max_concurrency=16`."""
    if level.concurrency is not None:
        return f"concurrency={level.concurrency}"
    cap = f"-max_concurrency={level.max_concurrency}" if level.max_concurrency else ""
    return f"rate={level.request_rate:g}{cap}"


def _label_of(level: LevelResult) -> str:
    """The `level` of the run's request lines."""
    from dflash_ops.bench.core.runner import Level, level_label

    return level_label(Level(level.concurrency, level.request_rate, level.max_concurrency))


def _stats(name: str, seconds: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    values = [s * 1000 for s in seconds] or [0.0]  # vLLM: np.mean(values or 0)
    stats = {
        f"mean_{name}_ms": statistics.fmean(values),
        f"median_{name}_ms": statistics.median(values),
        f"std_{name}_ms": statistics.pstdev(values),
    }
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        stats[f"p{word}_{name}_ms"] = percentile(values, p)
    return stats


def _max_in_flight(lines: Sequence[dict[str, Any]]) -> int:
    events = []
    for line in lines:
        if line.get("start_ms") is not None and line.get("e2e_ms") is not None:
            events += [(line["start_ms"], 1), (line["start_ms"] + line["e2e_ms"], -1)]
    peak = current = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):
        current += step
        peak = max(peak, current)
    return peak


def record(
    result: BenchResult,
    level: LevelResult,
    lines: Sequence[dict[str, Any]],
    wall_s: float,
    runs: Sequence[RunResult],
) -> dict[str, Any]:
    """vllm bench serve's result JSON for `lines` (requests of one level) over `wall_s`."""
    settings = result.settings
    ok = [line for line in lines if line["ok"]]
    ttfts = [line["ttft_ms"] / 1000 for line in ok if line["ttft_ms"] is not None]
    tpots = [line["tpot_ms"] / 1000 for line in ok if line["tpot_ms"] is not None]
    itls = [
        (b - a) / 1000
        for line in ok
        for a, b in zip(line["chunk_times_ms"], line["chunk_times_ms"][1:], strict=False)
    ]
    e2els = [line["e2e_ms"] / 1000 for line in ok if line["e2e_ms"] is not None]
    input_tokens = sum(line["prompt_tokens"] for line in ok)
    output_tokens = sum(line["output_tokens"] for line in ok)
    duration = wall_s if wall_s > 0 else math.nan
    good = [r.good_requests for r in runs]
    data: dict[str, Any] = {
        "date": _date(result.started_at),
        "endpoint_type": backend_of(settings.endpoint),
        "backend": backend_of(settings.endpoint),
        "label": settings.label,
        "model_id": result.model,
        "tokenizer_id": settings.tokenizer or result.model,
        "num_prompts": len(lines),
        **settings.metadata,
        "request_rate": "inf" if level.request_rate is None else level.request_rate,
        "burstiness": 1.0,
        "max_concurrency": level.concurrency or level.max_concurrency,
        "duration": wall_s,
        "completed": len(ok),
        "failed": len(lines) - len(ok),
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(ok) / duration,
        "request_goodput": (
            sum(g or 0 for g in good) / duration if settings.goodput and None not in good else None
        ),
        "output_throughput": output_tokens / duration,
        "total_token_throughput": (input_tokens + output_tokens) / duration,
        "max_concurrent_requests": _max_in_flight(lines),
    }
    samples = {"ttft": ttfts, "tpot": tpots, "itl": itls, "e2el": e2els}
    for name in settings.percentile_metrics:
        data.update(_stats(name, samples[name], settings.metric_percentiles))
    data.update(_spec_decode(runs))
    return data


def _spec_decode(runs: Sequence[RunResult]) -> dict[str, Any]:
    """vLLM's spec_decode_* keys from the passes' /metrics deltas (all passes counted, or none)."""
    stats = [r.spec_decode for r in runs]
    if not stats or any(s is None for s in stats):
        return {}
    drafts = sum(s.drafts for s in stats if s)
    draft_tokens = sum(s.draft_tokens for s in stats if s)
    accepted = sum(s.accepted for s in stats if s)
    if drafts <= 0 or draft_tokens <= 0:
        return {}
    positions = max(len(s.per_position_acceptance) for s in stats if s)
    per_position = [
        sum(
            s.per_position_acceptance[i] * s.drafts
            for s in stats
            if s and i < len(s.per_position_acceptance)
        )
        / drafts
        for i in range(positions)
    ]
    return {
        "spec_decode_acceptance_rate": accepted / draft_tokens * 100,
        "spec_decode_acceptance_length": 1 + accepted / drafts,
        "spec_decode_num_drafts": int(drafts),
        "spec_decode_draft_tokens": int(draft_tokens),
        "spec_decode_accepted_tokens": int(accepted),
        "spec_decode_per_position_acceptance_rates": per_position,
    }


def _date(iso: str) -> str:
    """vLLM's `date`: %Y%m%d-%H%M%S."""
    try:
        return datetime.fromisoformat(iso).strftime("%Y%m%d-%H%M%S")
    except ValueError:
        return iso


def run_records(
    result: BenchResult, lines: Sequence[dict[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    """Per level folder name, one record per pass (with vLLM's sweep `run_number`)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for level in result.levels:
        mine = [line for line in lines if line["level"] == _label_of(level)]
        records = []
        for index, run in enumerate(level.runs):
            of_run = [line for line in mine if line["run"] == index + 1]
            data = record(result, level, of_run, run.wall_s, [run])
            records.append({**data, "run_number": index})
        out[level_name(level)] = records
    return out


def pooled_record(
    result: BenchResult, level: LevelResult, lines: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """One level over all its passes, as one `vllm bench serve` run of --num-prompts requests."""
    mine = [line for line in lines if line["level"] == _label_of(level)]
    return record(result, level, mine, sum(r.wall_s for r in level.runs), level.runs)


def vllm_file_name(result: BenchResult, level: LevelResult) -> str:
    """vLLM's compute_result_filename: {label}-{rate}qps[-concurrency{N}]-{model}-{date}.json."""
    rate = "inf" if level.request_rate is None else f"{level.request_rate}"
    cap = level.concurrency or level.max_concurrency
    concurrency = f"-concurrency{cap}" if cap is not None else ""
    model = re.sub(r"[^A-Za-z0-9._-]", "_", result.model.split("/")[-1]) or "model"
    label = result.settings.label or backend_of(result.settings.endpoint)
    return f"{label}-{rate}qps{concurrency}-{model}-{_date(result.started_at)}.json"


def write(
    out: Path,
    result: BenchResult,
    lines: Sequence[dict[str, Any]],
    save_result: bool = False,
    result_filename: str | None = None,
) -> list[Path]:
    """The export of `result` into `out`, atomically file by file; the paths written."""
    written = []
    for name, records in run_records(result, lines).items():
        folder = out / FOLDER / name
        folder.mkdir(parents=True, exist_ok=True)
        for data in records:
            path = folder / f"run={data['run_number']}.json"
            replace_text(path, json.dumps(data, indent=2))
            written.append(path)
        replace_text(folder / "summary.json", json.dumps(records, indent=2))
        written.append(folder / "summary.json")
    if save_result or result_filename:
        for level in result.levels:
            name = result_filename or vllm_file_name(result, level)
            replace_text(out / name, json.dumps(pooled_record(result, level, lines)))
            written.append(out / name)
    return written
