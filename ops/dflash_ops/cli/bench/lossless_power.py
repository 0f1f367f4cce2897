"""`dflash-serve bench lossless-power`: the sampled lossless check's false-alarm and detection
rates on real engines (bench/lossless_power.py)."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Any

from dflash_ops.cli.arguments import add_field_flags, fields_from_flags, http_url
from dflash_ops.cli.bench.flags import needs_bench_extra

# PowerSettings' fields, as --flags (bounds are the model's: a wrong value is named in one line).
FIELDS = (
    "temperature", "planted_temperature", "samples", "prompts", "tokens", "trials",
    "concurrency", "alpha", "permutations", "seed",
)  # fmt: skip


def register(actions: Any) -> None:
    from dflash_ops.bench.lossless_power import PowerSettings

    parser = actions.add_parser(
        "lossless-power",
        help="the sampled lossless check's false-alarm and detection rates on real engines",
        description=(
            "Collects seeded continuations once (the reference at --temperature and at "
            "--planted-temperature, the speculative endpoint at --temperature), then runs "
            "--trials draws of the check's test per comparison and prints how often each "
            "failed: reference vs reference (false alarms), speculation vs reference, planted "
            "vs reference (detections), with Wilson 95%% intervals."
        ),
    )
    parser.add_argument("--base-url", type=http_url, required=True, help="the speculative engine")
    parser.add_argument(
        "--reference-url",
        type=http_url,
        required=True,
        help="the same model served without speculation",
    )
    parser.add_argument("--model", help="served model name (default: the first in /v1/models)")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    parser.add_argument(
        "--pools",
        type=Path,
        metavar="FILE",
        help="keep the collected continuations in FILE; when FILE exists, run the trials on "
        "it instead of collecting again",
    )
    add_field_flags(parser, PowerSettings, FIELDS, low=-1_000_000)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    needs_bench_extra()
    from dflash_ops.bench.core.two_sample import permutations_for
    from dflash_ops.bench.lossless_power import PowerSettings, measure

    settings = fields_from_flags(PowerSettings, args, FIELDS)
    result = asyncio.run(
        measure(args.base_url, args.reference_url, args.model, settings, args.api_key, args.pools)
    )
    print(result.model_dump_json(indent=2))
    pools = ", ".join(f"{name} {size}" for name, size in result.pool_sizes.items())
    print(
        f"sampled lossless check, {settings.samples} continuations of {settings.tokens} tokens "
        f"per side over {settings.prompts} prompts, alpha {settings.alpha:g}, "
        f"{permutations_for(settings.alpha, settings.permutations)} permutations; pools "
        f"({pools}) collected at concurrency {settings.concurrency} in "
        f"{result.collect_s:.0f} s, {result.seconds_per_test:.2f} s per test:"
    )
    for rate in result.rates:
        print("  " + rate.line())
    return 0
