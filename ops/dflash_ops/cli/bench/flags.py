"""The flags `bench` and its subcommands share (target, workload, limits) and how they are read:
one set of names for the benchmark run, the search and the sweep."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from dflash_ops.bench.core.prompts import FILE_SETS, PROMPT_SETS
from dflash_ops.bench.core.results import DEFAULT_REQUEST_TIMEOUT_S
from dflash_ops.cli.arguments import add_field_flags, fields_from_flags, http_url, number
from dflash_ops.errors import UserError

if TYPE_CHECKING:
    from dflash_ops.bench.core.results import BenchSettings, SampledCheckSettings
    from dflash_ops.bench.core.runner import Level
    from dflash_ops.bench.core.sampling import Sampling

# Bounds of the load a run may ask for: far above any real use, small enough to end.
MAX_CONCURRENCY = 4096
MAX_REQUESTS = 1_000_000
MAX_TOKENS = 1_000_000
MAX_SECONDS = 7 * 24 * 3600.0


def add_target_flags(parser: argparse.ArgumentParser) -> None:
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


def add_workload_flags(parser: argparse.ArgumentParser) -> None:
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
    parser.add_argument(
        "--seed",
        type=number(int, 0, 2**32 - 1),
        default=0,
        help="seeds the dataset's sampling (as vllm bench serve) and each sampled request's "
        "seed (0)",
    )
    add_sampling_flags(parser)
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


def add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    """vllm bench serve's sampling flags, with its meanings: a flag left out is not sent, and
    the server's generation defaults apply (vLLM's: temperature 1, unless the model's
    generation_config says otherwise)."""
    group = parser.add_argument_group(
        "sampling",
        "Acceptance depends on how the target samples: measure under your traffic's sampling. "
        "Left out, a parameter is not sent and the server's default applies (as in vllm bench "
        "serve); --temperature 0 is greedy.",
    )
    group.add_argument(
        "--temperature", type=number(float, 0, 100), help="sampling temperature (0: greedy)"
    )
    group.add_argument("--top-p", type=number(float, 0, 1, low_open=True), help="top-p (0 to 1]")
    group.add_argument("--top-k", type=number(int, -1, 1_000_000), help="top-k (-1 or 0: off)")
    group.add_argument("--min-p", type=number(float, 0, 1), help="min-p [0, 1]")
    group.add_argument(
        "--ignore-eos",
        action="store_true",
        help="generate --max-tokens whatever the model says (always on with --dataset-name "
        "random, as in vllm bench serve)",
    )
    group.add_argument(
        "--request-seeds",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="send each sampled request a seed derived from --seed, so a run repeats where "
        "the engine honours seeds (greedy requests get none; default: on)",
    )


SAMPLED_CHECK_FIELDS = ("prompts", "samples", "tokens", "alpha")


def add_sampled_check_flags(parser: argparse.ArgumentParser) -> None:
    """--sampled-lossless-FIELD for the fields of SampledCheckSettings a user sizes."""
    from dflash_ops.bench.core.results import SampledCheckSettings

    group = parser.add_argument_group("the sampled lossless check (--check-sampled-lossless)")
    add_field_flags(group, SampledCheckSettings, SAMPLED_CHECK_FIELDS, "sampled-lossless-")


def sampled_check_settings(args: argparse.Namespace) -> SampledCheckSettings:
    """SampledCheckSettings from the flags; a value out of range is named in one line."""
    from dflash_ops.bench.core.results import SampledCheckSettings

    return fields_from_flags(
        SampledCheckSettings, args, SAMPLED_CHECK_FIELDS, "sampled-lossless-", seed=args.seed
    )


def sampling_of(args: argparse.Namespace) -> Sampling:
    from dflash_ops.bench.core.sampling import Sampling

    if args.temperature is None:
        print(
            "note: no --temperature: the requests carry none, so the server's default sampling "
            "applies (vLLM's: temperature 1 unless the model's generation_config says "
            "otherwise), as with vllm bench serve; --temperature 0 is greedy",
            file=sys.stderr,
        )
    return Sampling(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        ignore_eos=args.ignore_eos or args.dataset_name == "random",
        request_seeds=args.request_seeds,
    )


def check_out(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise UserError(f"--out {out}: cannot write there ({err.strerror})") from None


def needs_bench_extra() -> None:
    import importlib.util

    missing = [m for m in ("aiohttp", "matplotlib") if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(
            f"the benchmark needs {', '.join(missing)}: pip install 'dflash-serve[bench]'"
        )


def bench_settings(args: argparse.Namespace) -> BenchSettings:
    from dflash_ops.bench.core.results import BenchSettings

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
        sampling=sampling_of(args),
    )


def load_levels(args: argparse.Namespace) -> list[Level]:
    """--concurrency or --request-rate (with --max-concurrency) as levels; default 1,4."""
    from dflash_ops.bench.core.runner import Level

    if args.max_concurrency and not args.request_rate:
        raise UserError("--max-concurrency caps --request-rate levels; use --concurrency alone")
    if args.request_rate:
        levels = [
            Level(request_rate=r, max_concurrency=args.max_concurrency) for r in args.request_rate
        ]
    else:
        levels = [Level(concurrency=c) for c in (args.concurrency or [1, 4])]
    return levels
