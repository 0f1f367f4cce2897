"""`dflash-serve bench`, `bench compare`, `bench sidecar` and `bench client`."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dflash_ops.errors import UserError


def _positive_list(kind: Callable[[str], float]) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        try:
            values = [kind(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected numbers like 1,4") from None
        if not values or any(v <= 0 for v in values):
            raise argparse.ArgumentTypeError(f"{text!r}: every value must be above 0")
        return values

    return parse


def _positive(kind: Callable[[str], float]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r}: must be above 0")
        return value

    return parse


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
    parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="engine base URL")
    parser.add_argument("--model", help="served model name (default: the first in /v1/models)")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY"),
        help="bearer token for an engine started with an API key (default: $OPENAI_API_KEY, "
        "as vllm bench serve); also sent to --check-lossless",
    )
    load = parser.add_mutually_exclusive_group()
    load.add_argument(
        "--concurrency", type=_positive_list(int), help="in-flight requests per level (1,4)"
    )
    load.add_argument(
        "--request-rate",
        type=_positive_list(float),
        help="Poisson arrivals per second per level, e.g. 2,8 (open loop)",
    )
    parser.add_argument(
        "--max-concurrency", type=_positive(int), help="with --request-rate: cap in flight"
    )
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--num-requests", type=_positive(int), help="requests per run (32)")
    length.add_argument("--duration", type=_positive(float), help="seconds of arrivals per run")
    parser.add_argument(
        "--prompts",
        choices=["fixed", "random", "shared-prefix"],
        default="fixed",
        help="fixed: the 10 prompts of the seed's measurement; random: random lengths around "
        "--input-len words; shared-prefix: one --input-len system prompt for every request",
    )
    parser.add_argument("--input-len", type=_positive(int), default=256)
    parser.add_argument("--max-tokens", type=_positive(int), default=128)
    parser.add_argument("--repeats", type=_positive(int), default=3, help="runs per level (3)")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up requests (2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument(
        "--check-lossless",
        metavar="REFERENCE_URL",
        help="also require greedy outputs token-identical to this endpoint, which serves the "
        "same model without speculation, at each --lossless-concurrency",
    )
    parser.add_argument("--reference-model", help="model name at the reference endpoint")
    parser.add_argument(
        "--lossless-concurrency", type=_positive_list(int), default=[1, 4], help="(1,4)"
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
    sidecar.add_argument("--cycles", type=_positive(int), default=2000)
    sidecar.add_argument("--hours", type=_positive(float), default=24.0)
    sidecar.add_argument("--scrape-interval", type=_positive(float), default=2.0)
    sidecar.set_defaults(handler=run_sidecar_cost)
    client = actions.add_parser(
        "client",
        help="this client's throughput ceiling against an instant server, beside vllm bench serve",
    )
    client.add_argument("--concurrency", type=_positive(int), default=16)
    client.add_argument("--num-requests", type=_positive(int), default=200)
    client.add_argument("--max-tokens", type=_positive(int), default=128)
    client.add_argument("--repeats", type=_positive(int), default=3)
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
    if args.warmup < 0:
        raise UserError(f"--warmup {args.warmup}: must be 0 or more")
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

    loaded = []
    for given in (args.a, args.b):
        path = _results_path(given)
        try:
            loaded.append(BenchResult.model_validate_json(path.read_text()))
        except FileNotFoundError:
            raise UserError(
                f"{path}: no such file (give a results.json or its directory)"
            ) from None
        except (ValidationError, UnicodeDecodeError) as err:
            detail = err.errors()[0]["msg"] if isinstance(err, ValidationError) else str(err)
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
