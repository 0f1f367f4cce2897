"""Prompt sets read from the user's files, never downloaded at run time.

- `custom`: JSON Lines, one request per line: `{"prompt": "..."}` or `{"messages": [{"role":
  ..., "content": ...}, ...]}`, optionally `"output_len": N` (that request's max_tokens) and
  `"id"`. Blank lines are skipped.
- `sharegpt`: the ShareGPT JSON format (a list of `{"id": ..., "conversations": [{"from":
  "human", "value": ...}, {"from": "gpt", "value": ...}, ...]}`): the first human turn of each
  conversation is the prompt. Conversations without one are skipped and counted.
- `spec_bench`: vLLM's SpecBench format (Spec-Bench's `question.jsonl`: one `{"question_id",
  "category", "turns": [...]}` per line): the first turn is the prompt, the category is kept (the
  results report each category's figures); `category` keeps one. Shuffled with the run's seed, as
  vLLM does (the file is sorted by category: a short run of it in file order is one category).

A malformed entry is an error naming the file, the line or entry, and what was expected.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dflash_ops.bench.core.prompts import Prompt, PromptSetName
from dflash_ops.errors import UserError
from dflash_ops.files import read_text

MAX_OUTPUT_LEN = 1_000_000
MAX_FILE_BYTES = 2 * 1024**3  # the public ShareGPT V3 file is ~0.7 GB
ROLES = {"system", "user", "assistant", "developer", "tool"}


def load(
    name: PromptSetName,
    path: Path,
    category: str | None = None,
    seed: int = 0,
    output_len: int | None = None,
) -> list[Prompt]:
    """Every prompt of the file, in file order (spec_bench: shuffled by `seed`, of `category`
    if given, each with `output_len` as its max_tokens if given)."""
    text = read_text(path, f"the --dataset-path file of the {name} set", MAX_FILE_BYTES)
    if name == "spec_bench":
        prompts = _spec_bench(path, text, category, output_len)
        random.Random(seed).shuffle(prompts)
    else:
        prompts = _custom(path, text) if name == "custom" else _sharegpt(path, text)
    if not prompts:
        raise UserError(f"--dataset-path {path}: no prompts in it (is it the {name} format?)")
    return prompts


def _spec_bench(
    path: Path, text: str, category: str | None, output_len: int | None
) -> list[Prompt]:
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for number, where, entry in _json_lines(path, text):
        turns = entry.get("turns") if isinstance(entry, dict) else None
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise UserError(
                f'{where}: expected {{"question_id", "category", "turns": ["...", ...]}} '
                "(SpecBench's question.jsonl)"
            )
        kind = str(entry.get("category") or "uncategorized")
        seen.add(kind)
        if category is not None and kind != category:
            continue
        prompt_id = f"{kind}-{entry.get('question_id', number)}"
        prompts.append(Prompt(prompt_id, [{"role": "user", "content": turns[0]}], output_len, kind))
    if category is not None and not prompts and seen:
        raise UserError(
            f"--spec-bench-category {category}: not in {path}; it has {', '.join(sorted(seen))}"
        )
    return prompts


def _output_len(where: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_OUTPUT_LEN:
        raise UserError(
            f"{where}: output_len {value!r} must be a whole number in 1-{MAX_OUTPUT_LEN}"
        )
    return value


def _messages(where: str, value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise UserError(f"{where}: messages must be a non-empty list of {{role, content}}")
    messages = []
    for i, message in enumerate(value):
        if (
            not isinstance(message, dict)
            or message.get("role") not in ROLES
            or not isinstance(message.get("content"), str)
        ):
            raise UserError(
                f'{where}: messages[{i}] must be {{"role": one of {sorted(ROLES)}, '
                '"content": a string}'
            )
        messages.append({"role": message["role"], "content": message["content"]})
    return messages


def _json_lines(path: Path, text: str) -> Iterator[tuple[int, str, Any]]:
    """(line number, `path:line`, the parsed value) of every non-blank line; a line that is not
    JSON is an error naming it."""
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            yield number, where, json.loads(line)
        except json.JSONDecodeError as err:
            raise UserError(f"{where}: not JSON ({err.msg}); one JSON object per line") from None


def _custom(path: Path, text: str) -> list[Prompt]:
    prompts: list[Prompt] = []
    for _, where, entry in _json_lines(path, text):
        if not isinstance(entry, dict):
            raise UserError(f'{where}: expected an object like {{"prompt": "..."}}')
        if isinstance(entry.get("prompt"), str) and entry["prompt"]:
            messages = [{"role": "user", "content": entry["prompt"]}]
        elif "messages" in entry:
            messages = _messages(where, entry["messages"])
        else:
            raise UserError(f'{where}: expected "prompt" (a non-empty string) or "messages"')
        prompt_id = str(entry.get("id", f"custom-{len(prompts)}"))
        prompts.append(Prompt(prompt_id, messages, _output_len(where, entry.get("output_len"))))
    return prompts


def _sharegpt(path: Path, text: str) -> list[Prompt]:
    try:
        entries = json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(
            f"{path}: not JSON ({err.msg} at line {err.lineno}); ShareGPT files are one JSON list"
        ) from None
    if not isinstance(entries, list):
        raise UserError(f'{path}: expected a JSON list of {{"conversations": [...]}}')
    prompts: list[Prompt] = []
    for index, entry in enumerate(entries):
        where = f"{path} entry {index}"
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list):
            raise UserError(f'{where}: expected {{"conversations": [{{"from", "value"}}, ...]}}')
        human = next(
            (
                t["value"]
                for t in turns
                if isinstance(t, dict)
                and t.get("from") in ("human", "user")
                and isinstance(t.get("value"), str)
                and t["value"]
            ),
            None,
        )
        if human is None:
            continue
        prompt_id = str(entry.get("id", f"sharegpt-{index}"))
        prompts.append(Prompt(prompt_id, [{"role": "user", "content": human}]))
    return prompts
