"""`dflash-serve bench search`: the highest load whose goodput meets an SLO."""

from __future__ import annotations

import argparse
from typing import Any

from dflash_ops.bench.core.slo import ObjectivesAction
from dflash_ops.bench.core.slo import parse as slo_objectives
from dflash_ops.cli.arguments import number
from dflash_ops.cli.bench.flags import (
    MAX_CONCURRENCY,
    add_target_flags,
    add_workload_flags,
    needs_bench_extra,
)
from dflash_ops.cli.bench.run import finish, guarded
from dflash_ops.errors import UserError


def register(actions: Any) -> None:
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
    add_target_flags(search)
    search.add_argument("--axis", choices=["concurrency", "request-rate"], default="concurrency")
    search.add_argument(
        "--low", type=number(float, 0, 100_000.0, low_open=True), default=1.0, help="(1)"
    )
    search.add_argument(
        "--high", type=number(float, 0, 100_000.0, low_open=True), default=256.0, help="(256)"
    )
    search.add_argument(
        "--goodput",
        type=slo_objectives,
        nargs="+",
        action=ObjectivesAction,
        metavar="NAME:MS",
        required=True,
        help="e.g. ttft:2000 tpot:100 (as vllm bench serve spells it)",
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
    add_workload_flags(search)
    search.set_defaults(handler=run_search, repeats=1)


def run_search(args: argparse.Namespace) -> int:
    needs_bench_extra()
    from dflash_ops.bench.core import slo
    from dflash_ops.bench.core.run_directory import RunDirectory, save_json
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
    outcome = guarded(args, search.next_level)
    results_path = args.out / "results.json"
    if not results_path.is_file():
        return outcome if isinstance(outcome, int) else 1
    from dflash_ops.bench.core.results import BenchResult

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
        finish(args, outcome, RunDirectory.existing(args.out))
    print(f"{line}; probed {probes}; wrote {args.out / 'search.json'}")
    return outcome if isinstance(outcome, int) else 0
