"""Count output tokens with the model's tokenizer, for servers that send no usage chunk (as
`vllm bench serve` and AIPerf do). Loaded only when needed: `transformers` is not a dependency of
the benchmark otherwise, and no tokenizer is downloaded unless the user names a hub id."""

from __future__ import annotations

from collections.abc import Callable

from dflash_ops.errors import UserError


def load(name_or_path: str) -> Callable[[str], int]:
    """A function from text to its token count, or a UserError naming `--tokenizer`."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise UserError(
            f"--tokenizer {name_or_path}: counting tokens needs the transformers package "
            "(pip install transformers)"
        ) from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    except Exception as err:  # transformers raises OSError, ValueError, HF hub errors...
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(
            f"--tokenizer {name_or_path}: cannot load a tokenizer ({first[:200]}); pass the "
            "served model's directory or hub id"
        ) from None

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    return count
