"""Prompt sets for the benchmark: the fixed set, random lengths, and a shared system prompt.

- `fixed`: the ten prompts of the seed's measurement (math, code, chat), cycled.
- `random`: prompts of about `input_len` words drawn (seeded) from the repository's corpus, each
  a different length in [input_len / 2, input_len * 3 / 2].
- `shared-prefix`: one long system prompt of about `input_len` words shared by every request,
  then a short distinct question: what prefix caching should turn into cache hits.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from importlib import resources
from typing import Literal

PromptSetName = Literal["fixed", "random", "shared-prefix"]
PROMPT_SETS: tuple[PromptSetName, ...] = ("fixed", "random", "shared-prefix")


@dataclass(frozen=True)
class Prompt:
    id: str
    messages: list[dict[str, str]]


def fixed_prompts() -> list[tuple[str, str]]:
    data = json.loads(resources.files("dflash_ops.data").joinpath("bench_prompts.json").read_text())
    return [(p["id"], p["text"]) for p in data["prompts"]]


def _words() -> list[str]:
    text = resources.files("dflash_ops.data").joinpath("tiny_corpus.txt").read_text()
    return re.findall(r"[A-Za-z]+[,.]?", text)


def build(name: PromptSetName, count: int, input_len: int = 256, seed: int = 0) -> list[Prompt]:
    """`count` prompts of the named set (cycling the fixed set)."""
    if count < 1:
        raise ValueError("count must be at least 1")
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
    system = "You answer questions about this document.\n" + text(input_len)
    fixed = fixed_prompts()
    return [
        Prompt(
            f"shared-{i}",
            [
                {"role": "system", "content": system},
                {"role": "user", "content": f"{fixed[i % len(fixed)][1]} (question {i})"},
            ],
        )
        for i in range(count)
    ]


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]
