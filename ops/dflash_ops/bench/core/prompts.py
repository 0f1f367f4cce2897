"""Prompt sets for the benchmark: the fixed set, random lengths, shared system prompts, and
the user's own files.

- `fixed`: the ten prompts of the seed's measurement (math, code, chat), cycled.
- `random`: prompts of about `input_len` words drawn (seeded) from the repository's corpus, each
  a different length in [input_len / 2, input_len * 3 / 2].
- `shared-prefix`: `prefix_groups` long system prompts of about `input_len` words each, requests
  spread over them in turn, each followed by a short distinct question: what prefix caching
  (and, with several replicas, prefix-aware routing) should turn into cache hits.
- `custom`, `sharegpt`: a file the user points at (`dflash_ops.bench.core.prompt_files`).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from importlib import resources
from typing import Literal

PromptSetName = Literal["fixed", "random", "shared-prefix", "custom", "sharegpt"]
PROMPT_SETS: tuple[PromptSetName, ...] = ("fixed", "random", "shared-prefix", "custom", "sharegpt")
FILE_SETS: tuple[PromptSetName, ...] = ("custom", "sharegpt")


@dataclass(frozen=True)
class Prompt:
    id: str
    messages: list[dict[str, str]]
    max_tokens: int | None = None  # the set's own output length; None: the run's --max-tokens


def fixed_prompts() -> list[tuple[str, str]]:
    data = json.loads(resources.files("dflash_ops.data").joinpath("bench_prompts.json").read_text())
    return [(p["id"], p["text"]) for p in data["prompts"]]


def _words() -> list[str]:
    text = resources.files("dflash_ops.data").joinpath("tiny_corpus.txt").read_text()
    return re.findall(r"[A-Za-z]+[,.]?", text)


def build(
    name: PromptSetName, count: int, input_len: int = 256, seed: int = 0, prefix_groups: int = 1
) -> list[Prompt]:
    """`count` prompts of a built-in set (cycling the fixed set)."""
    if count < 1:
        raise ValueError("count must be at least 1")
    if name in FILE_SETS:
        raise ValueError(f"the {name} set is read from a file: prompt_files.load")
    if name == "fixed":
        base = fixed_prompts()
        return [
            Prompt(f"{base[i % len(base)][0]}#{i // len(base)}", _user(base[i % len(base)][1]))
            for i in range(count)
        ]
    rng = random.Random(seed)
    words = _words()

    def text(length: int) -> str:
        start = rng.randrange(len(words))
        picked = [words[(start + j) % len(words)] for j in range(length)]
        return " ".join(picked)

    if name == "random":
        return [
            Prompt(
                f"random-{i}",
                _user(text(rng.randint(max(1, input_len // 2), max(1, input_len * 3 // 2)))),
            )
            for i in range(count)
        ]
    systems = [
        f"You answer questions about document {g}.\n" + text(input_len)
        for g in range(max(1, prefix_groups))
    ]
    fixed = fixed_prompts()
    return [
        Prompt(
            f"shared-{i % len(systems)}-{i}",
            [
                {"role": "system", "content": systems[i % len(systems)]},
                {"role": "user", "content": f"{fixed[i % len(fixed)][1]} (question {i})"},
            ],
        )
        for i in range(count)
    ]


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]
