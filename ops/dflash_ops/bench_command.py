"""`dflash-serve bench` and `dflash-serve bench compare`."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from dflash_ops.errors import UserError


def _concurrency(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected numbers like 1,4") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: concurrency levels must be >= 1")
    return values


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "bench",
        help="benchmark an OpenAI-compatible vLLM endpoint (throughput, acceptance)",
        description=(
            "Send the fixed prompt set (math, code, chat) greedily at each concurrency, after a "
            "warm-up, and report output tokens per wall second plus mean acceptance length, "
            "drafted-token acceptance rate and per-position acceptance from /metrics deltas. "
            "Writes OUT/results.json, OUT/results.md and OUT/acceptance.png. "
            "`dflash-serve bench compare A.json B.json` prints two runs side by side."
        ),
    )
    parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="engine base URL")
    parser.add_argument("--model", help="served model name (default: the first in /v1/models)")
    parser.add_argument("--concurrency", type=_concurrency, default=[1, 4], help="e.g. 1,4")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1, help="passes over the prompt set")
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument(
        "--check-lossless",
        metavar="REFERENCE_URL",
        help="also compare greedy outputs with an endpoint serving the same model without "
        "speculation; they must be token-identical",
    )
    parser.add_argument("--reference-model", help="model name at the reference endpoint")
    parser.add_argument("--format", choices=["text", "json"], default="text")
    parser.set_defaults(handler=run)
    actions = parser.add_subparsers(dest="bench_action", metavar="{compare}")
    compare = actions.add_parser("compare", help="print two results.json side by side")
    compare.add_argument("a", type=Path, help="baseline results.json (e.g. MTP-3)")
    compare.add_argument("b", type=Path, help="candidate results.json (e.g. DFlash block 8)")
    compare.set_defaults(handler=run_compare)
    sidecar = actions.add_parser(
        "sidecar",
        help="cost of one sidecar scrape cycle on a ~3,000-line exposition, and memory over a day",
    )
    sidecar.add_argument("--cycles", type=int, default=2000)
    sidecar.add_argument("--hours", type=float, default=24.0, help="simulated hours of scrapes")
    sidecar.add_argument("--scrape-interval", type=float, default=2.0)
    sidecar.set_defaults(handler=run_sidecar_cost)


def run(args: argparse.Namespace) -> int:
    from dflash_ops.bench import report
    from dflash_ops.bench.client import Endpoint
    from dflash_ops.bench.runner import run_bench

    async def go() -> Any:
        model = args.model
        if model is None:
            endpoint = Endpoint(args.base_url)
            try:
                models = await endpoint.models()
            finally:
                await endpoint.aclose()
            if not models:
                raise UserError(f"{args.base_url} serves no model")
            model = models[0]
        return await run_bench(
            args.base_url,
            model,
            args.concurrency,
            args.max_tokens,
            repeats=args.repeats,
            reference_url=args.check_lossless,
            reference_model=args.reference_model,
        )

    result = asyncio.run(go())
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


def run_compare(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from dflash_ops.bench import report
    from dflash_ops.bench.results import BenchResult

    loaded = []
    for path in (args.a, args.b):
        try:
            loaded.append(BenchResult.model_validate_json(path.read_text()))
        except FileNotFoundError:
            raise UserError(f"{path}: no such file") from None
        except ValidationError as err:
            raise UserError(
                f"{path} is not a dflash-serve results.json: {err.errors()[0]['msg']}"
            ) from None
    print(
        report.compare(loaded[0], loaded[1], args.a.parent.name or "A", args.b.parent.name or "B")
    )
    return 0


def run_sidecar_cost(args: argparse.Namespace) -> int:
    from dflash_ops.bench.sidecar_cost import measure

    cost = measure(args.cycles, args.hours, args.scrape_interval)
    print(cost.model_dump_json(indent=2))
    print(
        f"scrape+parse+window update on {cost.exposition_lines} lines: p50 {cost.p50_ms:.2f} ms, "
        f"p99 {cost.p99_ms:.2f} ms; RSS over {cost.simulated_hours:g} h of "
        f"{cost.scrape_interval_s:g} s scrapes: "
        + ", ".join(f"{k} {v:.1f} MB" for k, v in cost.rss_mb.items())
    )
    return 0
