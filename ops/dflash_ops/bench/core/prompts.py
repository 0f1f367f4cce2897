"""Prompt sets for the benchmark: the fixed set, random lengths, shared system prompts, and
the user's own files.

- `fixed`: the ten prompts of the seed's measurement (math, code, chat), cycled.
- `random`: `vllm bench serve`'s random dataset, in tokens of the served model's tokenizer: each
  prompt `prefix_len` tokens shared by all, then a length drawn in [input_len * (1 - r),
  input_len * (1 + r)] (r: the input range ratio), and an output length drawn the same way
  around `output_len`; the text is the repository's corpus (seeded), cut at that many tokens.
- `shared-prefix`: `prefix_groups` long system prompts of `input_len` tokens each, requests
  spread over them in turn, each followed by a short distinct question: what prefix caching
  (and, with several replicas, prefix-aware routing) should turn into cache hits.
- `custom`, `sharegpt`, `spec_bench`: a file the user points at
  (`dflash_ops.bench.core.prompt_files`).
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass
from importlib import resources
from typing import Literal, Protocol

PromptSetName = Literal["fixed", "random", "shared-prefix", "custom", "sharegpt", "spec_bench"]
PROMPT_SETS: tuple[PromptSetName, ...] = (
    "fixed", "random", "shared-prefix", "custom", "sharegpt", "spec_bench"
)  # fmt: skip
FILE_SETS: tuple[PromptSetName, ...] = ("custom", "sharegpt", "spec_bench")
TOKEN_SETS: tuple[PromptSetName, ...] = ("random", "shared-prefix")  # sized in tokens


class Tokenizer(Protocol):
    """What the token-sized sets need of a (Hugging Face) tokenizer."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...


@dataclass(frozen=True)
class RandomShape:
    """The lengths of `vllm bench serve`'s random dataset, in tokens, by its flags' meanings:
    --random-input-len, --random-output-len, --random-range-ratio (input and output) and
    --random-prefix-len."""

    input_len: int = 256
    output_len: int | None = None  # None: the run's --max-tokens, not drawn
    input_ratio: float = 0.0
    output_ratio: float = 0.0
    prefix_len: int = 0

    @staticmethod
    def bounds(length: int, ratio: float) -> tuple[int, int]:
        """vLLM's interval: [floor(L (1 - r)), ceil(L (1 + r))], at least 1."""
        return max(1, math.floor(length * (1 - ratio))), max(1, math.ceil(length * (1 + ratio)))


@dataclass(frozen=True)
class Prompt:
    id: str
    messages: list[dict[str, str]]
    max_tokens: int | None = None  # the set's own output length; None: the run's --max-tokens
    category: str | None = None  # the set's category of the prompt (spec_bench), if any


def fixed_prompts() -> list[tuple[str, str]]:
    data = json.loads(resources.files("dflash_ops.data").joinpath("bench_prompts.json").read_text())
    return [(p["id"], p["text"]) for p in data["prompts"]]


def _words() -> list[str]:
    text = resources.files("dflash_ops.data").joinpath("tiny_corpus.txt").read_text()
    return re.findall(r"[A-Za-z]+[,.]?", text)


def build(
    name: PromptSetName,
    count: int,
    shape: RandomShape | None = None,
    seed: int = 0,
    prefix_groups: int = 1,
    tokenizer: Tokenizer | None = None,
) -> list[Prompt]:
    """`count` prompts of a built-in set (cycling the fixed set). The token-sized sets (random,
    shared-prefix) need the served model's `tokenizer`."""
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
    if tokenizer is None:
        raise ValueError(f"the {name} set is sized in tokens: pass the model's tokenizer")
    shape = shape or RandomShape()
    rng = random.Random(seed)
    words = _words()

    def token_ids(length: int) -> list[int]:
        """`length` tokens of corpus text from a seeded place."""
        ids: list[int] = []
        while len(ids) < length:
            start = rng.randrange(len(words))
            text = " ".join(words[(start + j) % len(words)] for j in range(max(8, length)))
            ids += tokenizer.encode((" " if ids else "") + text, add_special_tokens=False)
        return ids[:length]

    if name == "random":
        prefix = token_ids(shape.prefix_len) if shape.prefix_len else []
        low, high = RandomShape.bounds(shape.input_len, shape.input_ratio)
        prompts = []
        for i in range(count):
            ids = prefix + token_ids(rng.randint(low, high))
            output = None
            if shape.output_len is not None:
                output = rng.randint(*RandomShape.bounds(shape.output_len, shape.output_ratio))
            prompts.append(Prompt(f"random-{i}", _user(tokenizer.decode(ids)), output))
        return prompts
    systems = [
        f"You answer questions about document {g}.\n" + tokenizer.decode(token_ids(shape.input_len))
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
