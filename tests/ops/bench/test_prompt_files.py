"""The custom (JSONL) and ShareGPT prompt sets: the checked-in samples, and every malformed entry
refused with the file, the line and what was expected."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from dflash_ops.bench.core import prompt_files
from dflash_ops.bench.core.results import BenchSettings
from dflash_ops.bench.core.run_directory import RunDirectory
from dflash_ops.bench.core.runner import Level, Target, run_bench
from dflash_ops.errors import UserError

FIXTURES = Path(__file__).parent / "fixtures"


def test_custom_jsonl_sample() -> None:
    prompts = prompt_files.load("custom", FIXTURES / "custom.jsonl")
    assert [p.id for p in prompts] == ["sum", "haiku", "custom-2"]  # the blank line is skipped
    assert prompts[0].messages == [
        {"role": "user", "content": "What is 17 + 25? Answer with the number only."}
    ]
    assert [m["role"] for m in prompts[1].messages] == ["system", "user"]
    assert [p.max_tokens for p in prompts] == [12, 20, None]


def test_sharegpt_sample_takes_the_first_human_turn() -> None:
    prompts = prompt_files.load("sharegpt", FIXTURES / "sharegpt.json")
    assert [p.id for p in prompts] == ["conv-a", "conv-c"]  # conv-b has no human turn
    assert prompts[1].messages == [{"role": "user", "content": "Name three prime numbers."}]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", r"custom.jsonl:1: not JSON"),
        ('["a list"]', r"custom.jsonl:1: expected an object"),
        ('{"prompt": ""}', r'custom.jsonl:1: expected "prompt" \(a non-empty string\)'),
        ('{"text": "x"}', r'expected "prompt" \(a non-empty string\) or "messages"'),
        ('{"messages": []}', r"messages must be a non-empty list"),
        ('{"messages": [{"role": "robot", "content": "x"}]}', r"messages\[0\] must be"),
        ('{"messages": [{"role": "user", "content": 5}]}', r"messages\[0\] must be"),
        ('{"prompt": "x", "output_len": 0}', r"output_len 0 must be a whole number"),
        ('{"prompt": "x", "output_len": "12"}', r"output_len '12' must be"),
        ('{"prompt": "x", "output_len": true}', r"output_len True must be"),
        ("\n\n", r"no prompts in it"),
        ('{"prompt": "ok"}\n{"prompt": 3}', r"custom.jsonl:2:"),
    ],
)
def test_malformed_custom_lines_are_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "custom.jsonl"
    path.write_text(text)
    with pytest.raises(UserError, match=message):
        prompt_files.load("custom", path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", r"not JSON .* ShareGPT files are one JSON list"),
        ('{"conversations": []}', r"expected a JSON list"),
        ('[{"id": 1}]', r"entry 0: expected \{\"conversations\""),
        ('[{"conversations": [{"from": "gpt", "value": "x"}]}]', r"no prompts in it"),
    ],
)
def test_malformed_sharegpt_files_are_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "sharegpt.json"
    path.write_text(text)
    with pytest.raises(UserError, match=message):
        prompt_files.load("sharegpt", path)


def test_unreadable_dataset_paths_are_named(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found"):
        prompt_files.load("custom", tmp_path / "missing.jsonl")
    (tmp_path / "binary.jsonl").write_bytes(b"\xff\xfe")
    with pytest.raises(UserError, match="not UTF-8"):
        prompt_files.load("custom", tmp_path / "binary.jsonl")


def test_a_run_over_the_custom_set_honours_each_output_len(
    instant_server: str, tmp_path: Path
) -> None:
    prompts = prompt_files.load("custom", FIXTURES / "custom.jsonl")
    settings = BenchSettings(
        prompt_set="custom", input_len=1, max_tokens=7, num_requests=6, duration_s=None,
        repeats=1, warmup=0, seed=0, dataset_path=str(FIXTURES / "custom.jsonl"),
    )  # fmt: skip
    directory = RunDirectory(tmp_path)
    asyncio.run(
        run_bench(
            Target(instant_server, "fake"), [Level(concurrency=2)], settings, prompts=prompts,
            on_record=directory.record,
        )
    )  # fmt: skip
    directory.close()
    lines = [json.loads(x) for x in directory.requests_path.read_text().splitlines()]
    tokens = {line["prompt_id"]: line["output_tokens"] for line in lines}
    assert tokens == {"sum": 12, "haiku": 20, "custom-2": 7}  # the file's, else --max-tokens
    assert len(lines) == 6


def test_spec_bench_keeps_each_prompts_category_shuffled_by_the_seed() -> None:
    path = FIXTURES / "spec_bench.jsonl"
    prompts = prompt_files.load("spec_bench", path, seed=3)
    assert len(prompts) == 6
    assert {p.category for p in prompts} == {"writing", "coding", "translation"}
    assert all(p.messages[0]["content"].endswith("]") for p in prompts)  # the first turn only
    assert [p.id for p in prompt_files.load("spec_bench", path, seed=3)] == [p.id for p in prompts]
    assert [p.id for p in prompt_files.load("spec_bench", path, seed=4)] != [p.id for p in prompts]
    coding = prompt_files.load("spec_bench", path, category="coding", output_len=7)
    assert sorted(p.id for p in coding) == ["coding-101", "coding-102"]
    assert {p.max_tokens for p in coding} == {7}
    with pytest.raises(UserError, match=r"--spec-bench-category rag: not in .* it has coding, "):
        prompt_files.load("spec_bench", path, category="rag")


def test_a_malformed_spec_bench_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "question.jsonl"
    path.write_text('{"question_id": 1, "category": "math", "turns": []}\n')
    with pytest.raises(UserError, match=r"question.jsonl:1: expected .*SpecBench"):
        prompt_files.load("spec_bench", path)


def test_a_spec_bench_run_reports_tokens_per_step_by_category(
    scripted_server: str, tmp_path: Path
) -> None:
    """Chunks of 1, 2 and 3 tokens per step by category (the scripted /steps server), read back
    as each category's tokens per step, in results.json and results.md."""
    import subprocess
    import sys

    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "dflash_ops.cli", "bench", "--base-url", f"{scripted_server}/steps",
         "--dataset-name", "spec_bench", "--dataset-path", str(FIXTURES / "spec_bench.jsonl"),
         "--spec-bench-output-len", "7", "--num-prompts", "12", "--repeats", "2",
         "--concurrency", "2", "--warmup", "0", "--temperature", "0", "--result-dir", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    level = json.loads((out / "results.json").read_text())["levels"][0]
    figures = level["categories"]
    assert {name: f["requests"] for name, f in figures.items()} == {
        "coding": 4, "translation": 4, "writing": 4
    }  # fmt: skip
    assert {name: f["tokens_per_step"] for name, f in figures.items()} == {
        "coding": 3.0, "translation": 2.0, "writing": 1.0
    }  # fmt: skip
    assert "| concurrency 2 | coding | 4 | 3.00 |" in (out / "results.md").read_text()
