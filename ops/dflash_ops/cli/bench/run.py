"""`dflash-serve bench`: one benchmark run into --out, and how a run that ended early reports."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_ops.bench.core.slo import ObjectivesAction
from dflash_ops.bench.core.slo import parse as slo_objectives
from dflash_ops.cli.arguments import http_url, number_list
from dflash_ops.cli.bench.flags import (
    MAX_CONCURRENCY,
    add_load_flags,
    add_result_flags,
    add_sampled_check_flags,
    add_target_flags,
    add_workload_flags,
    bench_settings,
    check_out,
    load_levels,
    needs_bench_extra,
    prompts_from_file,
    sampled_check_settings,
)
from dflash_ops.errors import UserError

if TYPE_CHECKING:
    from dflash_ops.bench.core.results import BenchResult
    from dflash_ops.bench.core.runner import Level, LevelPlan


def register(subparsers: Any) -> argparse.ArgumentParser:
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
    add_target_flags(parser)
    add_load_flags(parser)
    add_workload_flags(parser)
    parser.add_argument(
        "--goodput",
        type=slo_objectives,
        nargs="+",
        action=ObjectivesAction,
        metavar="NAME:MS",
        help="service-level objectives in ms, as vllm bench serve spells them: "
        "ttft:MS tpot:MS e2el:MS (any of them); reports goodput (requests/s meeting every "
        "objective) and the share of requests that met them, per level",
    )
    parser.add_argument(
        "--check-lossless",
        metavar="REFERENCE_URL",
        type=http_url,
        help="also require greedy outputs token-identical to this endpoint, which serves the "
        "same model without speculation, at each --lossless-concurrency",
    )
    parser.add_argument(
        "--check-sampled-lossless",
        metavar="REFERENCE_URL",
        type=http_url,
        help="also test that sampled outputs follow the distribution of this endpoint, which "
        "serves the same model without speculation: seeded continuations under the run's "
        "sampling flags on both, compared position by position (a permutation test; exits 1 "
        "naming where they differ), at each --lossless-concurrency",
    )
    parser.add_argument("--reference-model", help="model name at the reference endpoint(s)")
    parser.add_argument(
        "--lossless-concurrency",
        type=number_list(int, 0, MAX_CONCURRENCY),
        default=[1, 4],
        help="(1,4)",
    )
    add_sampled_check_flags(parser)
    add_result_flags(parser)
    parser.set_defaults(handler=run)
    return parser


def execute(args: argparse.Namespace, levels: list[Level] | LevelPlan) -> BenchResult:
    """Run the benchmark into --out (see run_directory.run_into)."""
    from dflash_ops.bench.core import token_counter
    from dflash_ops.bench.core.client import check_base_url
    from dflash_ops.bench.core.lossless import Reference
    from dflash_ops.bench.core.run_directory import run_into
    from dflash_ops.bench.core.runner import Target

    check_base_url(args.base_url)
    reference = getattr(args, "check_lossless", None)
    if reference:
        check_base_url(reference)
    settings = bench_settings(args)
    prompts = prompts_from_file(args)
    counter = token_counter.load(args.tokenizer) if args.tokenizer else None
    check_out(args.out)
    compared = sampled = None
    if reference:
        compared = Reference(
            reference,
            getattr(args, "reference_model", None),
            tuple(getattr(args, "lossless_concurrency", (1, 4))),
        )
    sampled_url = getattr(args, "check_sampled_lossless", None)
    if sampled_url:
        check_base_url(sampled_url)
        sampled = Reference(
            sampled_url,
            getattr(args, "reference_model", None),
            tuple(getattr(args, "lossless_concurrency", (1, 4))),
            sampled_check_settings(args),
        )
    target = Target(args.base_url, args.model, args.api_key, counter, compared, sampled)
    return run_into(
        args.out,
        target,
        levels,
        settings,
        prompts,
        save_result=getattr(args, "save_result", False),
        result_filename=getattr(args, "result_filename", None),
    )


def finish(args: argparse.Namespace, result: BenchResult, paths: list[Path]) -> None:
    from dflash_ops.bench.core import report

    if args.format == "json":
        print(result.model_dump_json(indent=2))
    else:
        print(report.markdown(result))
        print("wrote " + ", ".join(str(p) for p in paths))


def guarded(args: argparse.Namespace, levels: list[Level] | LevelPlan) -> BenchResult | int:
    """The result, or the exit code of a run that ended early (its report printed)."""
    from dflash_ops.bench.core.run_directory import BenchInterrupted, RunDirectory
    from dflash_ops.bench.core.runner import BenchStopped

    try:
        return execute(args, levels)
    except BenchInterrupted as stopped:
        print(
            f"\ninterrupted: what was measured is in {args.out} (results.json status "
            '"interrupted"; requests.jsonl has every finished request)',
            file=sys.stderr,
        )
        return stopped.code
    except BenchStopped as stopped:
        finish(args, stopped.result, RunDirectory.existing(args.out))
        print(f"error: the run stopped early: {stopped.result.stop_reason}", file=sys.stderr)
        return 1


def run(args: argparse.Namespace) -> int:
    needs_bench_extra()
    from dflash_ops.bench.core.run_directory import RunDirectory

    levels = load_levels(args)
    if args.result_filename and len(levels) > 1:
        raise UserError(
            f"--result-filename {args.result_filename} names one file, for a run of one level: "
            f"this run has {len(levels)}; leave it out (--save-result names one per level)"
        )
    outcome = guarded(args, levels)
    if isinstance(outcome, int):
        return outcome
    finish(args, outcome, RunDirectory.existing(args.out))
    if outcome.lossless is not None and not outcome.lossless.passed:
        print("error: greedy outputs differ with speculation (not lossless)", file=sys.stderr)
        return 1
    failed = [c for c in outcome.sampled_lossless or [] if not c.passed]
    for check in failed:
        where = "; ".join(f"{f.prompt} position {f.position}: {f.detail}" for f in check.findings)
        print(
            f"error: sampled outputs differ with speculation at concurrency "
            f"{check.concurrency} (p = {check.p_value:.3g}, not lossless)"
            + (f": {where}" if where else ""),
            file=sys.stderr,
        )
    return 1 if failed else 0
