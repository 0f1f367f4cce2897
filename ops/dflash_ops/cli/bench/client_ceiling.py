"""`dflash-serve bench client`: this client's own throughput ceiling, beside vllm bench serve."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dflash_ops.cli.arguments import number
from dflash_ops.cli.bench.flags import MAX_CONCURRENCY, MAX_REQUESTS, MAX_TOKENS, needs_bench_extra


def register(actions: Any) -> None:
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


def run_client_ceiling(args: argparse.Namespace) -> int:
    import statistics

    needs_bench_extra()
    from dflash_ops.bench.client_ceiling import measure, vllm_client_available

    against = not args.no_vllm and vllm_client_available()
    if not args.no_vllm and not against:
        print("note: vLLM's benchmark client is not importable here: ours alone", file=sys.stderr)
    ceiling = measure(args.concurrency, args.num_requests, args.max_tokens, args.repeats, against)
    print(ceiling.model_dump_json(indent=2))
    ours = statistics.fmean(ceiling.ours_tokens_per_s)
    line = (
        f"client ceiling at concurrency {args.concurrency}, {args.num_requests} requests x "
        f"{args.max_tokens} tokens ({ceiling.sampling}): dflash-serve bench {ours:,.0f} tok/s"
    )
    if ceiling.ratio is not None:
        line += (
            f", vllm bench serve {statistics.fmean(ceiling.vllm_tokens_per_s):,.0f} tok/s "
            f"(ratio {ceiling.ratio:.2f}x, means of {args.repeats} alternating runs)"
        )
    print(line)
    return 0
