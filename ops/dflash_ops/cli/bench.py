"""`dflash-serve bench`, `bench compare`, `bench sidecar` and `bench client`."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from dflash_ops.cli.arguments import http_url, number, number_list
from dflash_ops.errors import UserError

# Bounds of the load a run may ask for: far above any real use, small enough to end.
MAX_CONCURRENCY = 4096
MAX_REQUESTS = 1_000_000
MAX_TOKENS = 1_000_000
MAX_SECONDS = 7 * 24 * 3600.0


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "bench",
        help="benchmark an OpenAI-compatible vLLM endpoint (latency, throughput, acceptance)",
        description=(
            "A serving benchmark for speculative decoding: streamed greedy requests at fixed "
            "concurrencies (closed loop) or request rates (Poisson arrivals), repeated, with "
            "TTFT, TPOT and inter-token latency percentiles, output tokens/s with its spread "
            "over the runs, and mean acceptance length, drafted-token acceptance rate and "
            "per-position acceptance from the engine's /metrics deltas. Writes OUT/results.json, "
            "OUT/results.md and OUT/acceptance.png. Subcommands: compare (two runs side by side), "
            "sidecar (the sidecar's scrape cost), client (this client's own ceiling)."
        ),
    )
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
    length = parser.add_mutually_exclusive_group()
    length.add_argument(
        "--num-requests", type=number(int, 1, MAX_REQUESTS), help="requests per run (32)"
    )
    length.add_argument(
        "--duration",
        type=number(float, 0, MAX_SECONDS, low_open=True),
        help="seconds of arrivals per run",
    )
    parser.add_argument(
        "--prompts",
        choices=["fixed", "random", "shared-prefix"],
        default="fixed",
        help="fixed: the 10 prompts of the seed's measurement; random: random lengths around "
        "--input-len words; shared-prefix: one --input-len system prompt for every request",
    )
    parser.add_argument("--input-len", type=number(int, 1, MAX_TOKENS), default=256)
    parser.add_argument("--max-tokens", type=number(int, 1, MAX_TOKENS), default=128)
    parser.add_argument(
        "--repeats", type=number(int, 1, 1000), default=3, help="runs per level (3)"
    )
    parser.add_argument(
        "--warmup", type=number(int, 0, 10_000), default=2, help="warm-up requests (2)"
    )
    parser.add_argument("--seed", type=number(int, 0, 2**32 - 1), default=0)
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
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
    parser.add_argument("--format", choices=["text", "json"], default="text")
    parser.set_defaults(handler=run)
    actions = parser.add_subparsers(dest="bench_action", metavar="{compare,sidecar,client}")
    compare = actions.add_parser("compare", help="print two results side by side")
    compare.add_argument("a", type=Path, help="baseline results.json or its directory (MTP-3)")
    compare.add_argument("b", type=Path, help="candidate results.json or directory (DFlash2)")
    compare.set_defaults(handler=run_compare)
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


def run(args: argparse.Namespace) -> int:
    _needs_bench_extra()
    from dflash_ops.bench import report
    from dflash_ops.bench.client import check_base_url
    from dflash_ops.bench.results import BenchSettings
    from dflash_ops.bench.runner import Level, run_bench

    check_base_url(args.base_url)
    if args.check_lossless:
        check_base_url(args.check_lossless)
    if args.max_concurrency and not args.request_rate:
        raise UserError("--max-concurrency caps --request-rate levels; use --concurrency alone")
    _check_out(args.out)
    if args.request_rate:
        levels = [
            Level(request_rate=r, max_concurrency=args.max_concurrency) for r in args.request_rate
        ]
    else:
        levels = [Level(concurrency=c) for c in (args.concurrency or [1, 4])]
    settings = BenchSettings(
        prompt_set=args.prompts,
        input_len=args.input_len,
        max_tokens=args.max_tokens,
        num_requests=None if args.duration else (args.num_requests or 32),
        duration_s=args.duration,
        repeats=args.repeats,
        warmup=args.warmup,
        seed=args.seed,
    )
    result = asyncio.run(
        run_bench(
            args.base_url,
            args.model,
            levels,
            settings,
            reference_url=args.check_lossless,
            reference_model=args.reference_model,
            lossless_concurrency=tuple(args.lossless_concurrency),
            api_key=args.api_key,
        )
    )
    paths = report.write(result, args.out)
    if args.format == "json":
        print(result.model_dump_json(indent=2))
    else:
        print(report.markdown(result))
        print("wrote " + ", ".join(str(p) for p in paths))
    if result.lossless is not None and not result.lossless.passed:
        print("error: greedy outputs differ with speculation (not lossless)", file=sys.stderr)
        return 1
    return 0


def _results_path(path: Path) -> Path:
    return path / "results.json" if path.is_dir() else path


def run_compare(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from dflash_ops.bench import report
    from dflash_ops.bench.results import BenchResult
    from dflash_ops.files import read_text

    loaded = []
    for given in (args.a, args.b):
        path = _results_path(given)
        text = read_text(path, "results (a results.json or its directory)")
        try:
            loaded.append(BenchResult.model_validate_json(text))
        except ValidationError as err:
            detail = err.errors()[0]["msg"]
            raise UserError(f"{path} is not a dflash-serve results.json: {detail}") from None
    names = [(_results_path(p).parent.name or str(p)) for p in (args.a, args.b)]
    print(report.compare(loaded[0], loaded[1], names[0], names[1]))
    return 0


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
