"""Sampling in the benchmark (dflash_ops.bench.core.sampling): vllm bench serve's flags with its
meanings reach every request body and every record of the run; runs of different workloads are
not compared as one; a sweep resumes only under the sampling it started with."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from dflash_ops.bench.core import report
from dflash_ops.bench.core.results import BenchResult, BenchSettings
from dflash_ops.bench.core.sampling import Sampling, request_seed
from dflash_ops.bench.sweep.run import SweepPlan, load_state
from dflash_ops.errors import UserError

CLI = [sys.executable, "-m", "dflash_ops.cli"]


def bench(server: str, out: Path, *flags: str) -> tuple[list[dict[str, Any]], BenchResult, str]:
    """A small run against the echo server: the bodies it received, results.json, stderr."""
    token = uuid.uuid4().hex
    base = f"{server}/echo/{token}"
    done = subprocess.run(
        [*CLI, "bench", "--base-url", base, "--concurrency", "1,2", "--num-requests", "4",
         "--repeats", "2", "--warmup", "0", "--max-tokens", "6", "--out", str(out), *flags],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    bodies = httpx.get(f"{base}/bodies", timeout=10).json()
    result = BenchResult.model_validate_json((out / "results.json").read_text())
    return bodies, result, done.stderr


SAMPLED = ["--temperature", "0.7", "--top-p", "0.9", "--top-k", "40", "--min-p", "0.05",
           "--ignore-eos", "--seed", "7"]  # fmt: skip


def test_every_sampling_option_reaches_the_bodies_and_the_records(
    scripted_server: str, tmp_path: Path
) -> None:
    bodies, result, _ = bench(scripted_server, tmp_path, *SAMPLED)
    assert len(bodies) == 16  # 2 levels x 2 runs x 4 requests
    for body in bodies:
        assert (body["temperature"], body["top_p"], body["top_k"], body["min_p"]) == (
            0.7, 0.9, 40, 0.05,
        )  # fmt: skip
        assert body["ignore_eos"] is True and isinstance(body["seed"], int)
    # One seed per request of a pass, derived from --seed and the pass: the two levels' first
    # runs send the same seeds (each level's passes repeat), the second runs others.
    seeds = [b["seed"] for b in bodies]
    assert len(set(seeds)) == 8, seeds
    assert sorted(seeds[:4]) == sorted(request_seed(7, i) for i in range(4))
    sampling = result.settings.sampling
    assert sampling == Sampling(temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, ignore_eos=True)
    markdown = (tmp_path / "results.md").read_text()
    assert "temperature 0.7, top-p 0.9, top-k 40, min-p 0.05, per-request seeds" in markdown
    lines = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert sorted(line["seed"] for line in lines) == sorted(seeds)
    assert all(len(line["output_digest"]) == 16 for line in lines)


def test_left_out_nothing_is_sent_and_the_run_says_so(scripted_server: str, tmp_path: Path) -> None:
    """As vllm bench serve: no --temperature, no temperature in the request (the server's
    default applies), no ignore_eos; a seed still makes the run repeatable."""
    bodies, result, stderr = bench(scripted_server, tmp_path)
    for body in bodies:
        assert not {"temperature", "top_p", "top_k", "min_p", "ignore_eos"} & set(body)
        assert "seed" in body
    assert result.settings.sampling == Sampling()
    assert "no --temperature" in stderr and "--temperature 0 is greedy" in stderr
    assert "the server's default temperature" in (tmp_path / "results.md").read_text()


def test_greedy_needs_no_seed_and_random_prompts_ignore_eos(
    scripted_server: str, tmp_path: Path, tokenizer_dir: Path
) -> None:
    bodies, result, _ = bench(
        scripted_server, tmp_path, "--temperature", "0", "--no-request-seeds",
        "--dataset-name", "random", "--random-input-len", "8", "--tokenizer", str(tokenizer_dir),
    )  # fmt: skip
    assert all(b["temperature"] == 0 and "seed" not in b for b in bodies)
    assert all(b["ignore_eos"] is True for b in bodies)  # as vllm bench serve does for random
    assert result.settings.sampling.describe() == "temperature 0 (greedy), ignore-eos"


def test_random_prompts_without_a_tokenizer_are_refused_in_one_line(
    scripted_server: str, tmp_path: Path
) -> None:
    """The scripted server loaded its model from nowhere on this machine: no tokenizer to size
    the prompts in, and none is downloaded behind the user's back."""
    done = subprocess.run(
        [*CLI, "bench", "--base-url", f"{scripted_server}/echo/{uuid.uuid4().hex}",
         "--dataset-name", "random",
         "--num-requests", "2", "--repeats", "1", "--warmup", "0", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "--dataset-name random is sized in tokens" in last and "pass --tokenizer" in last
    assert "Traceback" not in done.stderr and "huggingface.co" not in done.stderr


def test_the_same_seed_sends_the_same_seeds(scripted_server: str, tmp_path: Path) -> None:
    first, _, _ = bench(scripted_server, tmp_path / "a", "--temperature", "1", "--seed", "3")
    again, _, _ = bench(scripted_server, tmp_path / "b", "--temperature", "1", "--seed", "3")
    other, _, _ = bench(scripted_server, tmp_path / "c", "--temperature", "1", "--seed", "4")
    seeds = [sorted(b["seed"] for b in bodies) for bodies in (first, again, other)]
    assert seeds[0] == seeds[1] != seeds[2]


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--temperature", "-1"), ("--temperature", "nan"), ("--top-p", "0"), ("--top-p", "1.5"),
     ("--top-k", "-2"), ("--min-p", "2"), ("--top-k", "4.5"), ("--temperature", "hot")],
)  # fmt: skip
def test_bad_sampling_values_get_one_line(flag: str, value: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [*CLI, "bench", "--out", str(tmp_path), flag, value],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert flag in last and value in last and "Traceback" not in done.stderr, done.stderr


def result_with(sampling: Sampling, base: BenchResult) -> BenchResult:
    settings = base.settings.model_copy(update={"sampling": sampling})
    return base.model_copy(update={"settings": settings})


def test_compare_refuses_different_workloads_by_name(scripted_server: str, tmp_path: Path) -> None:
    _, greedy, _ = bench(scripted_server, tmp_path / "greedy", "--temperature", "0")
    sampled = result_with(Sampling(temperature=1.0), greedy)
    with pytest.raises(report.DifferentWorkloads) as refused:
        report.compare([("greedy", greedy), ("sampled", sampled)])
    message = str(refused.value)
    assert "sampling differs" in message and "greedy: temperature 0 (greedy)" in message
    assert "sampled: temperature 1" in message
    marked = report.compare([("greedy", greedy), ("sampled", sampled)], different_workloads=True)
    assert "| sampled (*) |" in marked
    assert (
        "- sampling: greedy: temperature 0 (greedy), stops at EOS; sampled (*): temperature 1"
        in (marked)
    )
    # The command line: one line naming the difference and the way out.
    (tmp_path / "sampled").mkdir()
    (tmp_path / "sampled" / "results.json").write_text(sampled.model_dump_json())
    done = subprocess.run(
        [*CLI, "bench", "compare", str(tmp_path / "greedy"), str(tmp_path / "sampled")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "sampling differs" in done.stderr and "--different-workloads" in done.stderr


def test_results_written_before_sampling_was_recorded_read_as_greedy() -> None:
    settings = BenchSettings.model_validate(
        {"prompt_set": "fixed", "input_len": 8, "max_tokens": 8, "num_requests": 4,
         "duration_s": None, "repeats": 1, "warmup": 0, "seed": 0}
    )  # fmt: skip
    assert settings.sampling.greedy and settings.sampling.ignore_eos


def test_a_sweep_resumes_only_under_the_sampling_it_started_with(tmp_path: Path) -> None:
    settings = BenchSettings.model_validate(
        {"prompt_set": "fixed", "input_len": 8, "max_tokens": 8, "num_requests": 4,
         "duration_s": None, "repeats": 1, "warmup": 0, "seed": 0,
         "sampling": {"temperature": 1.0}}
    )  # fmt: skip
    plan = SweepPlan(settings=[], levels=[], bench=settings, deployer="local")
    (tmp_path / "sweep.json").write_text(
        json.dumps({"plan": json.loads(plan.model_dump_json()), "done": ["draft_model-k2"]})
    )
    assert load_state(tmp_path, plan, fresh=False).done == ["draft_model-k2"]
    greedy = plan.model_copy(
        update={"bench": settings.model_copy(update={"sampling": Sampling(temperature=0)})}
    )
    with pytest.raises(UserError, match="belongs to a sweep with other settings"):
        load_state(tmp_path, greedy, fresh=False)


def test_a_random_flag_alone_means_vllms_random_set(
    scripted_server: str, tmp_path: Path, tokenizer_dir: Path
) -> None:
    """`bench --random-output-len 32`, as a vllm bench serve user types it: its default set is
    random, so the flag is not refused for shaping another set; every request asks for 32."""
    bodies, result, _ = bench(
        scripted_server, tmp_path, "--random-output-len", "32", "--tokenizer", str(tokenizer_dir)
    )
    assert result.settings.prompt_set == "random" and result.settings.output_len == 32
    assert {b["max_tokens"] for b in bodies} == {32} and all(b["ignore_eos"] for b in bodies)


def test_the_completions_endpoint_sends_the_prompt_as_written(
    scripted_server: str, tmp_path: Path
) -> None:
    """--endpoint /v1/completions, vllm bench serve's default API: a prompt, not messages, and
    the streamed `text` counted; the results and the vLLM-format export say which API."""
    bodies, result, _ = bench(scripted_server, tmp_path, "--endpoint", "/v1/completions")
    assert bodies and all(isinstance(b["prompt"], str) and "messages" not in b for b in bodies)
    assert result.settings.endpoint == "/v1/completions"
    assert all(run.output_tokens == 4 * 6 for level in result.levels for run in level.runs)
    exported = json.loads((tmp_path / "vllm" / "concurrency=1" / "run=0.json").read_text())
    assert exported["backend"] == "openai" and exported["completed"] == 4
