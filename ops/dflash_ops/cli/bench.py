"""`dflash-serve bench`, `bench compare`, `bench sidecar` and `bench client`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_ops.bench.prompts import FILE_SETS, PROMPT_SETS
from dflash_ops.bench.results import DEFAULT_REQUEST_TIMEOUT_S
from dflash_ops.bench.slo import parse as slo_objectives
from dflash_ops.cli import bench_job as job
from dflash_ops.cli import bench_router as router
from dflash_ops.cli import bench_sweep as sweep
from dflash_ops.cli.arguments import http_url, number, number_list
from dflash_ops.errors import UserError

if TYPE_CHECKING:
    from dflash_ops.bench.results import BenchResult, BenchSettings
    from dflash_ops.bench.runner import Level, LevelPlan

# Bounds of the load a run may ask for: far above any real use, small enough to end.
MAX_CONCURRENCY = 4096
MAX_REQUESTS = 1_000_000
MAX_TOKENS = 1_000_000
MAX_SECONDS = 7 * 24 * 3600.0


def _add_target_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--base-url", type=http_url, default="http://127.0.0.1:8000", help="engine base URL"
    )
    parser.add_argument("--model", help="served model name (default: the first in /v1/models)")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY"),
        help="bearer token for an engine started with an API key (default: $OPENAI_API_KEY, "
        "as vllm bench serve); also sent to --check-lossless",
    )


def _add_workload_flags(parser: argparse.ArgumentParser) -> None:
    """The request stream of every run, by the names `vllm bench serve` users know (older
    spellings kept as aliases)."""
    length = parser.add_mutually_exclusive_group()
    length.add_argument(
        "--num-prompts",
        "--num-requests",
        dest="num_requests",
        type=number(int, 1, MAX_REQUESTS),
        help="requests per run (32)",
    )
    length.add_argument(
        "--duration",
        type=number(float, 0, MAX_SECONDS, low_open=True),
        help="seconds of arrivals per run",
    )
    parser.add_argument(
        "--dataset-name",
        "--prompts",
        dest="dataset_name",
        choices=list(PROMPT_SETS),
        default="fixed",
        help="fixed: the 10 prompts of the reference measurement (default); random: random "
        "lengths around --random-input-len words; shared-prefix: --prefix-groups system prompts "
        "of --random-input-len words shared by the requests; custom: a JSONL file of "
        '{"prompt"} or {"messages"} (optional "output_len"); sharegpt: a ShareGPT JSON file '
        "(first human turn of each conversation). Files are never downloaded: --dataset-path",
    )
    parser.add_argument(
        "--dataset-path", type=Path, help="the file of the custom or sharegpt dataset"
    )
    parser.add_argument(
        "--prefix-groups",
        type=number(int, 1, 10_000),
        default=1,
        help="shared-prefix: how many distinct system prompts (1)",
    )
    parser.add_argument(
        "--metrics-url",
        dest="metrics_urls",
        action="append",
        type=http_url,
        metavar="URL",
        help="an engine whose /metrics the acceptance and prefix-cache counters are read from; "
        "repeat it for every replica behind a router: the counters are summed and each "
        "replica's share of the requests is reported (default: the target's own /metrics)",
    )
    parser.add_argument(
        "--random-input-len",
        "--input-len",
        dest="input_len",
        type=number(int, 1, MAX_TOKENS),
        default=256,
        help="random and shared-prefix: words per prompt or shared prefix (256)",
    )
    parser.add_argument(
        "--max-tokens",
        type=number(int, 1, MAX_TOKENS),
        default=128,
        help="output tokens per request, unless the dataset gives output_len (128)",
    )
    parser.add_argument(
        "--repeats", type=number(int, 1, 1000), default=3, help="runs per level (3)"
    )
    parser.add_argument(
        "--warmup", type=number(int, 0, 10_000), default=2, help="warm-up requests (2)"
    )
    parser.add_argument("--seed", type=number(int, 0, 2**32 - 1), default=0)
    parser.add_argument(
        "--request-timeout",
        type=number(float, 0, MAX_SECONDS, low_open=True),
        default=DEFAULT_REQUEST_TIMEOUT_S,
        help="seconds a request may take before it counts as a failed request of kind timeout "
        f"({DEFAULT_REQUEST_TIMEOUT_S:g}; raise it for very long outputs)",
    )
    parser.add_argument(
        "--tokenizer",
        help="count output tokens with this tokenizer (a model directory or hub id) when the "
        "server sends no usage chunk; results say which count was used",
    )
    parser.add_argument(
        "--result-dir",
        "--out",
        dest="out",
        type=Path,
        default=Path("bench-out"),
        help="where results.json, results.md, requests.jsonl and acceptance.png go, written "
        "as levels and requests complete (bench-out)",
    )
    parser.add_argument("--format", choices=["text", "json"], default="text")


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "bench",
        help="benchmark an OpenAI-compatible vLLM endpoint (latency, throughput, acceptance)",
        description=(
            "A serving benchmark for speculative decoding: streamed greedy requests at fixed "
            "concurrencies (closed loop) or request rates (Poisson arrivals), repeated, with "
            "TTFT, TPOT and inter-token latency percentiles, output tokens/s with its spread "
            "over the runs, goodput at an SLO, and mean acceptance length, drafted-token "
            "acceptance rate and per-position acceptance from the engine's /metrics deltas. "
            "Writes OUT/results.json, OUT/results.md, OUT/requests.jsonl and OUT/acceptance.png "
            "as it goes: an interrupted or failed run keeps what it measured. Subcommands: "
            "search (the highest load meeting an SLO), sweep (method x k x load, with a "
            "recommendation), compare (runs side by side), job (the "
            "benchmark as a Kubernetes Job), sidecar (the sidecar's scrape cost), client (this "
            "client's own ceiling)."
        ),
    )
    _add_target_flags(parser)
    load = parser.add_mutually_exclusive_group()
    load.add_argument(
        "--concurrency",
        type=number_list(int, 0, MAX_CONCURRENCY),
        help="in-flight requests per level (1,4)",
    )
    load.add_argument(
        "--request-rate",
        type=number_list(float, 0, 100_000.0),
        help="Poisson arrivals per second per level, e.g. 2,8 (open loop)",
    )
    parser.add_argument(
        "--max-concurrency",
        type=number(int, 1, MAX_CONCURRENCY),
        help="with --request-rate: cap in flight",
    )
    _add_workload_flags(parser)
    parser.add_argument(
        "--goodput",
        type=slo_objectives,
        help="service-level objectives in ms, as vllm bench serve spells them: "
        "ttft:MS,tpot:MS,e2e:MS (any of them); reports goodput (requests/s meeting every "
        "objective) and the share of requests that met them, per level",
    )
    parser.add_argument(
        "--check-lossless",
        metavar="REFERENCE_URL",
        type=http_url,
        help="also require greedy outputs token-identical to this endpoint, which serves the "
        "same model without speculation, at each --lossless-concurrency",
    )
    parser.add_argument("--reference-model", help="model name at the reference endpoint")
    parser.add_argument(
        "--lossless-concurrency",
        type=number_list(int, 0, MAX_CONCURRENCY),
        default=[1, 4],
        help="(1,4)",
    )
    parser.set_defaults(handler=run)
    actions = parser.add_subparsers(
        dest="bench_action", metavar="{search,sweep,compare,job,router-policies,sidecar,client}"
    )
    search = actions.add_parser(
        "search",
        help="the highest concurrency or request rate whose goodput meets an SLO",
        description=(
            "A bounded saturation search: from --low, the load doubles until a level misses "
            "the objectives (fewer than --slo-attainment of its requests meet every --goodput "
            "objective) or --high is reached, then the gap is bisected; at most --max-probes "
            "levels. Every probe is a full level (--repeats runs), kept in OUT/results.json."
        ),
    )
    _add_target_flags(search)
    search.add_argument("--axis", choices=["concurrency", "request-rate"], default="concurrency")
    search.add_argument(
        "--low", type=number(float, 0, 100_000.0, low_open=True), default=1.0, help="(1)"
    )
    search.add_argument(
        "--high", type=number(float, 0, 100_000.0, low_open=True), default=256.0, help="(256)"
    )
    search.add_argument(
        "--goodput", type=slo_objectives, required=True, help="e.g. ttft:2000,tpot:100"
    )
    search.add_argument(
        "--slo-attainment",
        type=number(float, 0, 1, low_open=True),
        default=0.9,
        help="share of a level's requests that must meet every objective (0.9)",
    )
    search.add_argument("--max-probes", type=number(int, 2, 64), default=12, help="(12)")
    search.add_argument(
        "--max-concurrency",
        type=number(int, 1, MAX_CONCURRENCY),
        help="with --axis request-rate: cap in flight",
    )
    _add_workload_flags(search)
    search.set_defaults(handler=run_search, repeats=1)
    compare = actions.add_parser(
        "compare", help="print several runs side by side, with ratios to the first"
    )
    compare.add_argument(
        "runs",
        type=Path,
        nargs="+",
        metavar="RUN",
        help="results.json files or their directories; the first is the baseline (e.g. MTP-3)",
    )
    compare.set_defaults(handler=run_compare)
    job.register(actions)
    sweep.register(actions, _add_workload_flags, MAX_CONCURRENCY)
    router.register(actions)
    sidecar = actions.add_parser(
        "sidecar",
        help="cost of one sidecar scrape cycle on a ~3,000-line exposition, and memory over a day",
    )
    sidecar.add_argument("--cycles", type=number(int, 1, 1_000_000), default=2000)
    sidecar.add_argument("--hours", type=number(float, 0, 24 * 31, low_open=True), default=24.0)
    sidecar.add_argument("--scrape-interval", type=number(float, 0.01, 60.0), default=2.0)
    sidecar.set_defaults(handler=run_sidecar_cost)
    client = actions.add_parser(
        "client",
        help="this client's throughput ceiling against an instant server, beside vllm bench serve",
    )
    client.add_argument("--concurrency", type=number(int, 1, MAX_CONCURRENCY), default=16)
    client.add_argument("--num-requests", type=number(int, 1, MAX_REQUESTS), default=200)
    client.add_argument("--max-tokens", type=number(int, 1, MAX_TOKENS), default=128)
    client.add_argument("--repeats", type=number(int, 1, 1000), default=3)
    client.add_argument(
        "--no-vllm", action="store_true", help="do not run vllm bench serve beside it"
    )
    client.set_defaults(handler=run_client_ceiling)


def _check_out(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise UserError(f"--out {out}: cannot write there ({err.strerror})") from None


def _needs_bench_extra() -> None:
    import importlib.util

    missing = [m for m in ("aiohttp", "matplotlib") if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(
            f"the benchmark needs {', '.join(missing)}: pip install 'dflash-serve[bench]'"
        )


def _settings(args: argparse.Namespace) -> BenchSettings:
    from dflash_ops.bench.results import BenchSettings

    if args.dataset_name in FILE_SETS and args.dataset_path is None:
        raise UserError(f"--dataset-name {args.dataset_name} reads --dataset-path FILE: give it")
    if args.dataset_path is not None and args.dataset_name not in FILE_SETS:
        raise UserError(
            f"--dataset-path is read by --dataset-name custom or sharegpt, not {args.dataset_name}"
        )
    if args.prefix_groups > 1 and args.dataset_name != "shared-prefix":
        raise UserError("--prefix-groups shapes --dataset-name shared-prefix only")
    return BenchSettings(
        prompt_set=args.dataset_name,
        input_len=args.input_len,
        max_tokens=args.max_tokens,
        num_requests=None if args.duration else (args.num_requests or 32),
        duration_s=args.duration,
        repeats=args.repeats,
        warmup=args.warmup,
        seed=args.seed,
        dataset_path=None if args.dataset_path is None else str(args.dataset_path),
        prefix_groups=args.prefix_groups,
        request_timeout_s=args.request_timeout,
        goodput=args.goodput or {},
        tokenizer=args.tokenizer,
        metrics_urls=args.metrics_urls or [],
    )


def _execute(args: argparse.Namespace, levels: list[Level] | LevelPlan) -> BenchResult:
    """Run the benchmark into --out (see run_directory.run_into)."""
    from dflash_ops.bench import prompt_files, token_counter
    from dflash_ops.bench.client import check_base_url
    from dflash_ops.bench.run_directory import run_into

    check_base_url(args.base_url)
    reference = getattr(args, "check_lossless", None)
    if reference:
        check_base_url(reference)
    settings = _settings(args)
    prompts = None
    if args.dataset_path is not None:
        prompts = prompt_files.load(args.dataset_name, args.dataset_path)
        print(f"dataset: {len(prompts)} prompts from {args.dataset_path}", file=sys.stderr)
    counter = token_counter.load(args.tokenizer) if args.tokenizer else None
    _check_out(args.out)
    return run_into(
        args.out,
        args.base_url,
        args.model,
        levels,
        settings,
        reference_url=reference,
        reference_model=getattr(args, "reference_model", None),
        lossless_concurrency=tuple(getattr(args, "lossless_concurrency", (1, 4))),
        api_key=args.api_key,
        prompts=prompts,
        token_counter=counter,
    )


def _finish(args: argparse.Namespace, result: BenchResult, paths: list[Path]) -> None:
    from dflash_ops.bench import report

    if args.format == "json":
        print(result.model_dump_json(indent=2))
    else:
        print(report.markdown(result))
        print("wrote " + ", ".join(str(p) for p in paths))


def _guarded(args: argparse.Namespace, levels: list[Level] | LevelPlan) -> BenchResult | int:
    """The result, or the exit code of a run that ended early (its report printed)."""
    from dflash_ops.bench.run_directory import BenchInterrupted, RunDirectory
    from dflash_ops.bench.runner import BenchStopped

    try:
        return _execute(args, levels)
    except BenchInterrupted as stopped:
        print(
            f"\ninterrupted: what was measured is in {args.out} (results.json status "
            '"interrupted"; requests.jsonl has every finished request)',
            file=sys.stderr,
        )
        return stopped.code
    except BenchStopped as stopped:
        _finish(args, stopped.result, RunDirectory.existing(args.out))
        print(f"error: the run stopped early: {stopped.result.stop_reason}", file=sys.stderr)
        return 1


def load_levels(args: argparse.Namespace) -> list[Level]:
    """--concurrency or --request-rate (with --max-concurrency) as levels; default 1,4."""
    from dflash_ops.bench.runner import Level

    if args.max_concurrency and not args.request_rate:
        raise UserError("--max-concurrency caps --request-rate levels; use --concurrency alone")
    if args.request_rate:
        levels = [
            Level(request_rate=r, max_concurrency=args.max_concurrency) for r in args.request_rate
        ]
    else:
        levels = [Level(concurrency=c) for c in (args.concurrency or [1, 4])]
    return levels


def run(args: argparse.Namespace) -> int:
    _needs_bench_extra()
    from dflash_ops.bench.run_directory import RunDirectory

    levels = load_levels(args)
    outcome = _guarded(args, levels)
    if isinstance(outcome, int):
        return outcome
    _finish(args, outcome, RunDirectory.existing(args.out))
    if outcome.lossless is not None and not outcome.lossless.passed:
        print("error: greedy outputs differ with speculation (not lossless)", file=sys.stderr)
        return 1
    return 0


def run_search(args: argparse.Namespace) -> int:
    _needs_bench_extra()
    from dflash_ops.bench import slo
    from dflash_ops.bench.run_directory import RunDirectory, save_json
    from dflash_ops.bench.saturation_search import SaturationSearch

    if args.low > args.high:
        raise UserError(f"--low {args.low:g} is above --high {args.high:g}")
    if args.axis == "concurrency" and (args.low != int(args.low) or args.high != int(args.high)):
        raise UserError("--axis concurrency searches whole numbers: --low and --high too")
    if args.max_concurrency and args.axis != "request-rate":
        raise UserError("--max-concurrency caps --axis request-rate levels only")
    search = SaturationSearch(
        axis=args.axis,
        low=args.low,
        high=args.high,
        attainment=args.slo_attainment,
        max_probes=args.max_probes,
        max_concurrency=args.max_concurrency,
    )
    outcome = _guarded(args, search.next_level)
    results_path = args.out / "results.json"
    if not results_path.is_file():
        return outcome if isinstance(outcome, int) else 1
    from dflash_ops.bench.results import BenchResult

    result = (
        outcome
        if not isinstance(outcome, int)
        else BenchResult.model_validate_json(results_path.read_text())
    )
    summary = search.summary(result.levels)
    save_json(args.out / "search.json", summary.model_dump_json(indent=2))
    unit = "in flight" if args.axis == "concurrency" else "requests/s"
    target = f"{args.slo_attainment:.0%} of requests within {slo.describe(args.goodput)}"
    if summary.best is None:
        line = f"no load met {target}: even {args.low:g} {unit} missed it"
    else:
        line = f"highest load meeting {target}: {summary.best:g} {unit}"
        if summary.bounded_by_high:
            line += " (the --high bound; the real limit may be higher)"
    probes = ", ".join(f"{p.load:g}{'' if p.passed else ' (missed)'}" for p in summary.probes)
    if not isinstance(outcome, int):
        _finish(args, outcome, RunDirectory.existing(args.out))
    print(f"{line}; probed {probes}; wrote {args.out / 'search.json'}")
    return outcome if isinstance(outcome, int) else 0


def run_compare(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from dflash_ops.bench import report
    from dflash_ops.bench.results import BenchResult
    from dflash_ops.files import read_text

    if len(args.runs) < 2:
        raise UserError("bench compare needs at least two runs (the first is the baseline)")
    loaded = []
    for given in args.runs:
        path = _results_path(given)
        text = read_text(path, "results (a results.json or its directory)")
        try:
            result = BenchResult.model_validate_json(text)
        except ValidationError as err:
            detail = err.errors()[0]["msg"]
            raise UserError(f"{path} is not a dflash-serve results.json: {detail}") from None
        loaded.append((_results_path(given).parent.name or str(given), result))
    try:
        print(report.compare(loaded))
    except ValueError:
        levels = "; ".join(
            f"{name}: {', '.join(lv.label for lv in r.levels) or 'none'}" for name, r in loaded
        )
        raise UserError(f"the runs share no load level ({levels})") from None
    return 0


def _results_path(path: Path) -> Path:
    return path / "results.json" if path.is_dir() else path


def run_sidecar_cost(args: argparse.Namespace) -> int:
    from dflash_ops.bench.sidecar_cost import measure

    cost = measure(args.cycles, args.hours, args.scrape_interval)
    print(cost.model_dump_json(indent=2))
    print(
        f"scrape+parse+window update on {cost.exposition_lines} lines: p50 {cost.p50_ms:.2f} ms, "
        f"p99 {cost.p99_ms:.2f} ms; parse alone {cost.parse_p50_ms:.2f} ms vs "
        f"prometheus_client's parser {cost.reference_parse_p50_ms:.2f} ms (p50); RSS over "
        f"{cost.simulated_hours:g} h of {cost.scrape_interval:g} s scrapes: "
        + ", ".join(f"{k} {v:.1f} MB" for k, v in cost.rss_mb.items())
        + f" (largest page: {cost.largest_page_bytes / 2**20:g} MiB, --max-page-bytes)"
    )
    return 0


def run_client_ceiling(args: argparse.Namespace) -> int:
    import statistics

    _needs_bench_extra()
    from dflash_ops.bench.client_ceiling import measure, vllm_client_available

    against = not args.no_vllm and vllm_client_available()
    if not args.no_vllm and not against:
        print("note: vLLM's benchmark client is not importable here: ours alone", file=sys.stderr)
    ceiling = measure(args.concurrency, args.num_requests, args.max_tokens, args.repeats, against)
    print(ceiling.model_dump_json(indent=2))
    ours = statistics.fmean(ceiling.ours_tokens_per_s)
    line = (
        f"client ceiling at concurrency {args.concurrency}, {args.num_requests} requests x "
        f"{args.max_tokens} tokens: dflash-serve bench {ours:,.0f} tok/s"
    )
    if ceiling.ratio is not None:
        line += (
            f", vllm bench serve {statistics.fmean(ceiling.vllm_tokens_per_s):,.0f} tok/s "
            f"(ratio {ceiling.ratio:.2f}x, means of {args.repeats} alternating runs)"
        )
    print(line)
    return 0
