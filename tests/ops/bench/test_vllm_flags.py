"""The flags `dflash-serve bench` shares with `vllm bench serve` mean what vLLM 0.33.0 means:
each command line is parsed by vLLM's own parser (`vllm.benchmarks.serve.add_cli_args`, in
.venv-vllm033) and by ours, and what it asks for (total requests, token lengths, load, SLO keys,
sampling) is compared. docs/bench-vllm-flags.md lists exactly the names both parsers define."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
from typing import Any

import pytest
from dflash_ops.cli import build_parser
from dflash_ops.cli.bench.flags import bench_settings, load_levels

from tests.conftest import REPO_ROOT

VLLM_PYTHON = REPO_ROOT / ".venv-vllm033" / "bin" / "python"
pytestmark = pytest.mark.skipif(
    not VLLM_PYTHON.exists(),
    reason="needs .venv-vllm033 (make setup) for vLLM 0.33.0's own benchmark parser",
)

# Run in .venv-vllm033: each command line through vLLM's parser and the mappings its main()
# applies before it benchmarks (--input-len, random's ignore_eos, the goodput check).
VLLM_MEANINGS = r"""
import json, math, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.benchmarks.serve import add_cli_args, check_goodput_args
from vllm.benchmarks.datasets.datasets import _parse_range_ratio
from vllm.benchmarks.datasets.utils import _resolve_range_ratios

parser = FlexibleArgumentParser()
add_cli_args(parser)
rows = json.loads(sys.stdin.read())
if rows == "options":
    print(json.dumps(sorted(o for o in parser._option_string_actions if o.startswith("--"))))
    raise SystemExit
out = []
for argv in rows:
    a = parser.parse_args(argv)
    if a.input_len is not None:
        a.random_input_len = a.input_len
    ratio = _resolve_range_ratios(_parse_range_ratio(a.random_range_ratio))
    rate = a.request_rate
    load = ({"closed_loop": a.max_concurrency} if math.isinf(rate) and a.max_concurrency
            else {"rate": rate, "cap": a.max_concurrency} if not math.isinf(rate) else "all")
    out.append({
        "total_requests": a.num_prompts,
        "load": load,
        "dataset": a.dataset_name,
        "dataset_path": a.dataset_path,
        "input_tokens": a.random_input_len,
        "output_tokens": a.random_output_len,
        "range_ratio": list(ratio),
        "prefix_tokens": a.random_prefix_len,
        "warmups": a.num_warmups,
        "seed": a.seed,
        "goodput": check_goodput_args(a),
        "sampling": {"temperature": a.temperature, "top_p": a.top_p, "top_k": a.top_k,
                     "min_p": a.min_p,
                     "ignore_eos": a.ignore_eos or a.dataset_name == "random"},
        "model": a.model, "base_url": a.base_url, "tokenizer": a.tokenizer,
        "label": a.label, "result_dir": a.result_dir,
        "metadata": dict(kv.split("=", 1) for kv in a.metadata or []),
        "percentile_metrics": (a.percentile_metrics or "ttft,tpot,itl").split(","),
        "metric_percentiles": [float(p) for p in a.metric_percentiles.split(",")],
        "result_file": [a.save_result, a.result_filename],
        "spec_bench": [a.spec_bench_category, a.spec_bench_output_len],
        "endpoint": a.endpoint,
    })
print(json.dumps(out))
"""

# Each row: a command line both parsers take, and the parts of its meaning it is about.
ROWS: list[tuple[list[str], tuple[str, ...]]] = [
    (["--num-prompts", "10"], ("total_requests",)),
    (["--num-prompts", "7", "--max-concurrency", "2"], ("total_requests", "load")),
    (["--max-concurrency", "4"], ("load",)),
    (["--request-rate", "2.5", "--max-concurrency", "4"], ("load",)),
    (["--request-rate", "inf", "--max-concurrency", "3"], ("load",)),
    (["--request-rate", "8"], ("load",)),
    (
        ["--dataset-name", "random", "--random-input-len", "32", "--random-output-len", "8",
         "--random-range-ratio", "0.25", "--random-prefix-len", "4"],
        ("dataset", "input_tokens", "output_tokens", "range_ratio", "prefix_tokens", "sampling"),
    ),
    (
        ["--dataset-name", "random", "--random-range-ratio", '{"input": 0.1, "output": 0.3}'],
        ("range_ratio",),
    ),
    (["--dataset-name", "random", "--input-len", "48"], ("input_tokens",)),
    (["--goodput", "ttft:100", "tpot:10", "e2el:900"], ("goodput",)),
    (["--goodput", "e2el:2500"], ("goodput",)),
    (["--num-warmups", "5"], ("warmups",)),
    (["--seed", "7"], ("seed",)),
    (
        ["--temperature", "0.7", "--top-p", "0.9", "--top-k", "20", "--min-p", "0.05",
         "--ignore-eos"],
        ("sampling",),
    ),
    # (vLLM's default set is random, which always ignores EOS: name one that does not)
    (
        ["--temperature", "0", "--dataset-name", "sharegpt", "--dataset-path", "c.json"],
        ("sampling",),
    ),
    (["--dataset-name", "sharegpt", "--dataset-path", "chats.json"], ("dataset", "dataset_path")),
    (
        ["--model", "m", "--base-url", "http://h:1", "--tokenizer", "tok"],
        ("model", "base_url", "tokenizer"),
    ),
    (["--result-dir", "somewhere"], ("result_dir",)),
    (["--label", "run-a", "--metadata", "tp=2", "note=x y"], ("label", "metadata")),
    (
        ["--percentile-metrics", "ttft,e2el", "--metric-percentiles", "50,99.9"],
        ("percentile_metrics", "metric_percentiles"),
    ),
    ([], ("percentile_metrics", "metric_percentiles", "result_file")),
    (["--save-result", "--result-filename", "one.json"], ("result_file",)),
    (["--endpoint", "/v1/completions"], ("endpoint",)),
    (["--endpoint", "/v1/chat/completions"], ("endpoint",)),
    (
        ["--dataset-name", "spec_bench", "--dataset-path", "question.jsonl",
         "--spec-bench-category", "coding", "--spec-bench-output-len", "64"],
        ("dataset", "dataset_path", "spec_bench"),
    ),
]  # fmt: skip


def vllm_side(payload: object) -> Any:
    done = subprocess.run(
        [str(VLLM_PYTHON), "-c", VLLM_MEANINGS],
        input=json.dumps(payload), capture_output=True, text=True, timeout=300,
        env=os.environ | {"VLLM_TARGET_DEVICE": "cpu"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def vllm_meanings() -> list[dict[str, Any]]:
    return vllm_side([argv for argv, _ in ROWS])  # type: ignore[no-any-return]


def our_meaning(argv: list[str]) -> dict[str, Any]:
    args = build_parser().parse_args(["bench", *argv])
    settings = bench_settings(args)
    levels = load_levels(args)
    assert len(levels) == 1 or not ({"--max-concurrency", "--request-rate"} & set(argv))
    level = levels[0]
    load: object = (
        {"closed_loop": level.concurrency}
        if level.concurrency is not None
        else {"rate": level.request_rate, "cap": level.max_concurrency}
    )
    sampling = settings.sampling
    return {
        "total_requests": sum(settings.requests_in_run(r) or 0 for r in range(settings.repeats)),
        "load": load,
        "dataset": settings.prompt_set,
        "dataset_path": settings.dataset_path,
        "input_tokens": settings.input_len if settings.input_unit == "tokens" else None,
        "output_tokens": settings.output_len,
        "range_ratio": [settings.input_range_ratio, settings.output_range_ratio],
        "prefix_tokens": settings.prefix_len,
        "warmups": settings.warmup,
        "seed": settings.seed,
        "goodput": {"e2el" if k == "e2e" else k: v for k, v in settings.goodput.items()},
        "sampling": {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "min_p": sampling.min_p,
            "ignore_eos": sampling.ignore_eos,
        },
        "model": args.model,
        "base_url": args.base_url,
        "tokenizer": settings.tokenizer,
        "label": settings.label,
        "result_dir": str(args.out),
        "metadata": settings.metadata,
        "percentile_metrics": settings.percentile_metrics,
        "metric_percentiles": settings.metric_percentiles,
        "result_file": [args.save_result, args.result_filename],
        "spec_bench": [settings.dataset_category, settings.output_len],
        "endpoint": settings.endpoint,
    }


@pytest.mark.parametrize(
    ("index", "row"), list(enumerate(ROWS)), ids=[" ".join(r[0]) for r in ROWS]
)
def test_a_shared_flag_means_what_vllm_bench_serve_means(
    index: int, row: tuple[list[str], tuple[str, ...]], vllm_meanings: list[dict[str, Any]]
) -> None:
    argv, about = row
    theirs, ours = vllm_meanings[index], our_meaning(argv)
    assert {k: ours[k] for k in about} == {k: theirs[k] for k in about}, argv


def test_the_docs_table_lists_exactly_the_flags_both_parsers_define() -> None:
    ours_parser = build_parser()
    bench = next(
        a for a in ours_parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict)
    ).choices["bench"]
    ours = {o for o in bench._option_string_actions if o.startswith("--")}
    shared = ours & set(vllm_side("options"))
    table = (REPO_ROOT / "docs" / "bench-vllm-flags.md").read_text()
    listed = {
        flag
        for line in table.splitlines()
        if line.startswith("| `--")
        for flag in re.findall(r"`(--[a-z-]+)`", line.split("|")[1])
    }
    assert listed == shared - {"--help"}
    tested = {word for argv, _ in ROWS for word in argv if word.startswith("--")}
    # Every listed flag but those whose meaning is a name or a path is in a compared row.
    assert shared - {"--help"} - tested == set(), shared - tested


def test_the_closed_loop_idiom_and_inf_rate_are_one_level_at_that_concurrency() -> None:
    for argv in (["--max-concurrency", "6"], ["--request-rate", "inf", "--max-concurrency", "6"]):
        levels = load_levels(build_parser().parse_args(["bench", *argv]))
        assert [(lv.concurrency, lv.request_rate) for lv in levels] == [(6, None)]
    assert math.isinf(build_parser().parse_args(["bench", "--request-rate", "inf"]).request_rate[0])
