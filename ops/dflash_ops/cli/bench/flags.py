"""The flags `bench` and its subcommands share (target, workload, limits) and how they are read:
one set of names for the benchmark run, the search and the sweep."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_ops.bench.core.prompts import FILE_SETS, PROMPT_SETS
from dflash_ops.bench.core.results import DEFAULT_REQUEST_TIMEOUT_S
from dflash_ops.bench.core.vllm_export import PERCENTILE_METRICS
from dflash_ops.cli.arguments import (
    add_field_flags,
    choice_list,
    fields_from_flags,
    http_url,
    number,
    number_list,
)
from dflash_ops.cli.extras import require_extra
from dflash_ops.errors import UserError

if TYPE_CHECKING:
    from dflash_ops.bench.core.prompts import Prompt
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


def add_load_flags(parser: argparse.ArgumentParser) -> None:
    """The levels: closed-loop concurrencies or Poisson request rates (load_levels)."""
    load = parser.add_mutually_exclusive_group()
    load.add_argument(
        "--concurrency",
        type=number_list(int, 0, MAX_CONCURRENCY),
        help="in-flight requests per level, a closed loop (1,4)",
    )
    load.add_argument(
        "--request-rate",
        type=rate_list,
        help="Poisson arrivals per second per level, e.g. 2,8 (open loop); inf, as in vllm "
        "bench serve: every request at once, --max-concurrency in flight",
    )
    parser.add_argument(
        "--max-concurrency",
        type=number(int, 1, MAX_CONCURRENCY),
        help="the most requests in flight: caps --request-rate levels; alone, as in vllm bench "
        "serve, one closed-loop level at that concurrency",
    )


def rate_list(text: str) -> list[float]:
    """Comma-separated request rates above 0, or inf (vllm bench serve's default)."""
    one = number(float, 0, 100_000.0, low_open=True)
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"{text!r}: expected rates like 2,8 or inf")
    return [math.inf if part.lower() == "inf" else one(part) for part in parts]


def add_workload_flags(parser: argparse.ArgumentParser) -> None:
    """The request stream of every run, by the names `vllm bench serve` users know (older
    spellings kept as aliases)."""
    length = parser.add_mutually_exclusive_group()
    length.add_argument(
        "--num-prompts",
        dest="num_prompts",
        type=number(int, 1, MAX_REQUESTS),
        help="requests per level, as vllm bench serve counts them (its total): spread over the "
        "--repeats runs, the first runs one more when it does not divide",
    )
    length.add_argument(
        "--num-requests",
        dest="num_requests",
        type=number(int, 1, MAX_REQUESTS),
        help="requests per run, each of the --repeats runs (32)",
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
        help="fixed: the 10 prompts of the reference measurement (default, unless a --random-* "
        "flag is given: then random, vllm bench serve's default); random: vllm "
        "bench serve's, --random-input-len tokens; shared-prefix: --prefix-groups system "
        "prompts of --random-input-len tokens shared by the requests; custom: a JSONL file of "
        '{"prompt"} or {"messages"} (optional "output_len"); sharegpt: a ShareGPT JSON file '
        "(first human turn of each conversation); spec_bench: vLLM's SpecBench format "
        "(Spec-Bench's question.jsonl; figures per category). Files are never downloaded: "
        "--dataset-path",
    )
    parser.add_argument(
        "--dataset-path", type=Path, help="the file of the custom, sharegpt or spec_bench set"
    )
    parser.add_argument(
        "--endpoint",
        choices=["/v1/chat/completions", "/v1/completions"],
        default="/v1/chat/completions",
        help="the API the requests go to: chat (default; the server applies the model's chat "
        "template) or completions (the prompt as written; vllm bench serve's default)",
    )
    parser.add_argument(
        "--spec-bench-category",
        help="spec_bench: only this category (default: all, each reported on its own)",
    )
    parser.add_argument(
        "--spec-bench-output-len",
        type=number(int, 1, MAX_TOKENS),
        help="spec_bench: output tokens per request (default: --max-tokens; vLLM: 256)",
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
    add_random_flags(parser)
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
        "--num-warmups",
        "--warmup",
        dest="warmup",
        type=number(int, 0, 10_000),
        default=2,
        help="warm-up requests before the first level, not measured (2)",
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
        help="the served model's tokenizer (a directory or hub id): sizes the random and "
        "shared-prefix prompts (default: the directory the server loaded, if on this machine) "
        "and, in bench, counts output tokens when the server sends no usage chunk",
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
    parser.add_argument(
        "--label", help="a name for the run, kept in results.json and its vLLM-format export"
    )
    parser.add_argument(
        "--metadata",
        metavar="KEY=VALUE",
        nargs="*",
        type=key_value,
        help="key-value pairs kept with the results, as vllm bench serve keeps them",
    )


def add_result_flags(parser: argparse.ArgumentParser) -> None:
    """vllm bench serve's result flags. Every run is also written in its format under
    OUT/vllm/ (a pass per file, as its sweep lays them out); these add its single files."""
    group = parser.add_argument_group("vllm bench serve's result files")
    group.add_argument(
        "--save-result",
        action="store_true",
        help="also write each level, pooled over its runs, as one vllm bench serve result "
        "file in --result-dir, named as vLLM names it",
    )
    group.add_argument(
        "--result-filename",
        type=file_name,
        help="that file's name, for a run of one level (implies --save-result)",
    )
    group.add_argument(
        "--percentile-metrics",
        type=choice_list(PERCENTILE_METRICS, "metrics", "ttft,tpot,itl"),
        help="the metrics the vLLM-format results give percentiles of (ttft,tpot,itl)",
    )
    group.add_argument(
        "--metric-percentiles",
        type=number_list(float, 0, 100, low_open=False),
        help="which percentiles, e.g. 25,50,99 (99)",
    )


def file_name(text: str) -> str:
    if not text or "/" in text or text in (".", ".."):
        raise argparse.ArgumentTypeError(
            f"{text!r}: a file name in --result-dir, without a directory"
        )
    return text


def add_random_flags(parser: argparse.ArgumentParser) -> None:
    """vllm bench serve's random dataset flags, in tokens of the served model's tokenizer
    (--tokenizer, else the one the server loaded: /v1/models `root`)."""
    group = parser.add_argument_group(
        "random and shared-prefix prompts (lengths in tokens, as vllm bench serve)"
    )
    group.add_argument(
        "--random-input-len",
        "--input-len",
        dest="input_len",
        type=number(int, 1, MAX_TOKENS),
        help="random: input tokens per request; shared-prefix: tokens per shared system "
        "prompt (256; vllm bench serve: 1024)",
    )
    group.add_argument(
        "--random-output-len",
        dest="random_output_len",
        type=number(int, 1, MAX_TOKENS),
        help="random: output tokens per request (default: --max-tokens)",
    )
    group.add_argument(
        "--random-range-ratio",
        dest="random_range_ratio",
        type=range_ratio,
        help="random: lengths drawn in [len * (1 - r), len * (1 + r)]; one number for input "
        'and output, or {"input": r, "output": r} (0)',
    )
    group.add_argument(
        "--random-prefix-len",
        dest="random_prefix_len",
        type=number(int, 0, MAX_TOKENS),
        help="random: tokens of one prefix every prompt starts with, before its own input (0)",
    )


def range_ratio(text: str) -> tuple[float, float]:
    """--random-range-ratio as vLLM reads it: a number, or a JSON object with input and output;
    each in [0, 1)."""
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        parsed = text
    if isinstance(parsed, dict) and set(parsed) == {"input", "output"}:
        values = [parsed["input"], parsed["output"]]
    elif isinstance(parsed, (int, float, str)) and not isinstance(parsed, bool):
        values = [parsed, parsed]
    else:
        raise argparse.ArgumentTypeError(
            f'{text!r}: expected a number in [0, 1) or {{"input": R, "output": R}}'
        )
    ratios = []
    for value in values:
        try:
            ratio = float(value)
        except (TypeError, ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"{text!r}: {value!r} is not a number") from None
        if not 0 <= ratio < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: each ratio must be in [0, 1)")
        ratios.append(ratio)
    return ratios[0], ratios[1]


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE, e.g. tp=2")
    return key.strip(), value.strip()


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


def prompts_from_file(args: argparse.Namespace) -> list[Prompt] | None:
    """The --dataset-path file's prompts (custom, sharegpt, spec_bench), or None."""
    from dflash_ops.bench.core import prompt_files

    if args.dataset_path is None:
        return None
    prompts = prompt_files.load(
        args.dataset_name,
        args.dataset_path,
        category=args.spec_bench_category,
        seed=args.seed,
        output_len=args.spec_bench_output_len,
    )
    print(f"dataset: {len(prompts)} prompts from {args.dataset_path}", file=sys.stderr)
    return prompts


def check_out(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise UserError(f"--out {out}: cannot write there ({err.strerror})") from None


def needs_bench_extra() -> None:
    require_extra("bench", ("aiohttp", "matplotlib", "numpy"), "the benchmark")


DEFAULT_INPUT_LEN = 256  # tokens (vllm bench serve: 1024; this CPU engine is slow)
# The flags that shape one prompt set only, by destination: (the flag, the set it shapes).
SET_FLAGS = {
    "random_output_len": ("--random-output-len", "random"),
    "random_range_ratio": ("--random-range-ratio", "random"),
    "random_prefix_len": ("--random-prefix-len", "random"),
    "spec_bench_category": ("--spec-bench-category", "spec_bench"),
    "spec_bench_output_len": ("--spec-bench-output-len", "spec_bench"),
}


def resolve_dataset(args: argparse.Namespace) -> None:
    """--dataset-name as given; left out, `fixed`, or `random` when a --random-* flag shapes it
    (vllm bench serve's default set is random: `bench --random-output-len 32` means it)."""
    if args.dataset_name is None:
        random = ["input_len", *(d for d, (_, name) in SET_FLAGS.items() if name == "random")]
        shaped = any(getattr(args, dest, None) is not None for dest in random)
        args.dataset_name = "random" if shaped and args.dataset_path is None else "fixed"


def bench_settings(args: argparse.Namespace) -> BenchSettings:
    from dflash_ops.bench.core.results import BenchSettings

    resolve_dataset(args)
    if args.dataset_name in FILE_SETS and args.dataset_path is None:
        raise UserError(f"--dataset-name {args.dataset_name} reads --dataset-path FILE: give it")
    if args.dataset_path is not None and args.dataset_name not in FILE_SETS:
        raise UserError(
            "--dataset-path is read by --dataset-name custom, sharegpt or spec_bench, not "
            f"{args.dataset_name}"
        )
    if args.prefix_groups > 1 and args.dataset_name != "shared-prefix":
        raise UserError("--prefix-groups shapes --dataset-name shared-prefix only")
    for dest, (flag, name) in SET_FLAGS.items():
        if getattr(args, dest) is not None and args.dataset_name != name:
            raise UserError(
                f"{flag} shapes --dataset-name {name} only, not {args.dataset_name}"
                + (": use --max-tokens" if dest.endswith("output_len") else "")
            )
    total = args.num_prompts
    if total is not None and total < args.repeats:
        raise UserError(
            f"--num-prompts {total} is the level's total over --repeats {args.repeats} runs: "
            f"a run would get no request; give at least {args.repeats}, or --repeats {total}"
        )
    input_ratio, output_ratio = args.random_range_ratio or (0.0, 0.0)
    return BenchSettings(
        prompt_set=args.dataset_name,
        input_len=args.input_len or DEFAULT_INPUT_LEN,
        input_unit="tokens",
        max_tokens=args.max_tokens,
        num_requests=None if args.duration or total else (args.num_requests or 32),
        total_requests=total,
        duration_s=args.duration,
        repeats=args.repeats,
        warmup=args.warmup,
        seed=args.seed,
        output_len=args.random_output_len or args.spec_bench_output_len,
        dataset_category=args.spec_bench_category,
        input_range_ratio=input_ratio,
        output_range_ratio=output_ratio,
        prefix_len=args.random_prefix_len or 0,
        endpoint=args.endpoint,
        label=args.label,
        metadata=dict(args.metadata or []),
        **_percentiles(args),
        dataset_path=None if args.dataset_path is None else str(args.dataset_path),
        prefix_groups=args.prefix_groups,
        request_timeout_s=args.request_timeout,
        goodput=args.goodput or {},
        tokenizer=args.tokenizer,
        metrics_urls=args.metrics_urls or [],
        sampling=sampling_of(args),
    )


def _percentiles(args: argparse.Namespace) -> dict[str, list[Any]]:
    """The vLLM-format export's percentile choices, where this command takes them."""
    chosen: dict[str, list[Any]] = {}
    if getattr(args, "percentile_metrics", None):
        chosen["percentile_metrics"] = args.percentile_metrics
    if getattr(args, "metric_percentiles", None):
        chosen["metric_percentiles"] = args.metric_percentiles
    return chosen


def load_levels(args: argparse.Namespace) -> list[Level]:
    """--concurrency or --request-rate (with --max-concurrency) as levels; default 1,4.
    As in vllm bench serve, --max-concurrency alone (its request rate is inf: every request at
    once, so many in flight) is a closed loop at that concurrency, and so is a rate of inf."""
    from dflash_ops.bench.core.runner import Level

    rates = args.request_rate or []
    if args.max_concurrency and not rates:
        return [Level(concurrency=args.max_concurrency)]
    levels = []
    for rate in rates:
        if math.isinf(rate):
            if not args.max_concurrency:
                raise UserError(
                    "--request-rate inf sends every request at once: give --max-concurrency "
                    "N for how many may be in flight (or --concurrency N)"
                )
            levels.append(Level(concurrency=args.max_concurrency))
        else:
            levels.append(Level(request_rate=rate, max_concurrency=args.max_concurrency))
    return levels or [Level(concurrency=c) for c in (args.concurrency or [1, 4])]
