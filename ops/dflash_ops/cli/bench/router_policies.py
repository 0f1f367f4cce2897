"""`dflash-serve bench router-policies`: vLLM's router policies side by side on local replicas."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from dflash_ops.cli.arguments import choice_list, number
from dflash_ops.cli.bench.flags import needs_bench_extra
from dflash_ops.errors import UserError
from dflash_ops.vocabulary import ROUTER_POLICIES

# kv_aware is fed by the engines' KV-cache events (the benchmark starts the engines with
# --kv-events-config for it).
policy_list = choice_list(ROUTER_POLICIES, "policies", "cache_aware,round_robin")


def register(actions: Any) -> None:
    parser = actions.add_parser(
        "router-policies",
        help="vLLM router policies side by side on local CPU replicas: prefix-cache hit rate",
        description=(
            "Starts --replicas vLLM CPU engines (the local stack's tiny model), then for each "
            "policy the real vllm-router in front of them, and sends the shared-prefix prompt set "
            "with --prefix-groups prefixes through it: the prefix-cache hit rate summed over the "
            "replicas (from their own /metrics), each replica's share of requests, TTFT and "
            "throughput, beside one replica alone. Every run uses fresh prefixes."
        ),
    )
    parser.add_argument("--replicas", type=number(int, 2, 8), default=2, help="(2)")
    parser.add_argument(
        "--policies",
        type=policy_list,
        default="cache_aware,round_robin,consistent_hash",
        help="(%(default)s)",
    )
    parser.add_argument("--prefix-groups", type=number(int, 1, 1000), default=8, help="(8)")
    parser.add_argument(
        "--num-prompts", type=number(int, 1, 100_000), default=48, help="requests per run (48)"
    )
    parser.add_argument("--concurrency", type=number(int, 1, 256), default=4, help="(4)")
    parser.add_argument(
        "--random-input-len",
        type=number(int, 16, 100_000),
        default=400,
        help="words per shared prefix (400)",
    )
    parser.add_argument("--max-tokens", type=number(int, 1, 4096), default=16, help="(16)")
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(".router-bench"),
        help="the replicas' own local stacks (.router-bench)",
    )
    parser.add_argument("--enforce-eager", action="store_true", help="faster engine start")
    parser.add_argument(
        "--no-scale-out",
        action="store_true",
        help="start the engines without --enable-scale-out: vLLM then refuses the render "
        "requests cache_aware tokenizes with, and it routes without prefix knowledge",
    )
    parser.add_argument(
        "--router-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="passed to every vllm-router, e.g. --router-arg=--balance-abs-threshold=4",
    )
    parser.add_argument("--out", type=Path, help="also write the report as JSON here")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from dflash_ops.bench.router_policies import measure, table

    needs_bench_extra()
    if args.out is not None and args.out.is_dir():
        raise UserError(f"--out {args.out} is a directory: give a file name (router.json)")
    report = measure(
        args.state_dir,
        args.replicas,
        args.policies,
        args.prefix_groups,
        args.num_prompts,
        args.concurrency,
        args.random_input_len,
        args.max_tokens,
        args.enforce_eager,
        args.router_arg,
        scale_out=not args.no_scale_out,
    )
    if args.out is not None:
        args.out.write_text(report.model_dump_json(indent=2))
    sys.stdout.write(table(report))
    return 0
