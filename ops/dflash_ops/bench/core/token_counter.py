"""The served model's tokenizer, loaded only when needed: to size the random and shared-prefix
prompts in tokens (as `vllm bench serve` does), and to count output tokens for servers that send
no usage chunk (as `vllm bench serve` and AIPerf do). `transformers` is not a dependency of the
benchmark otherwise, and no tokenizer is downloaded unless the user names (or the server reports)
a hub id."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dflash_ops.errors import UserError


def load_tokenizer(
    name_or_path: str, needed_by: str = "counting tokens", served_from: str | None = None
) -> Any:
    """A Hugging Face tokenizer, or a UserError naming `--tokenizer` and why it was needed.
    `served_from`: the name is where the server says it loaded the model (not the user's
    --tokenizer): only a directory or the hub cache here is used, nothing is downloaded."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise UserError(
            f"--tokenizer {name_or_path}: {needed_by} needs the transformers package "
            "(pip install transformers)"
        ) from None
    try:
        return AutoTokenizer.from_pretrained(name_or_path, local_files_only=bool(served_from))
    except Exception as err:  # transformers raises OSError, ValueError, HF hub errors...
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if served_from:
            raise UserError(
                f"{needed_by}: the server loaded {served_from} from {name_or_path}, which is "
                "no tokenizer on this machine; pass --tokenizer DIR or HUB_ID"
            ) from None
        raise UserError(
            f"--tokenizer {name_or_path}: cannot load a tokenizer for {needed_by} "
            f"({first[:200]}); pass the served model's directory or hub id"
        ) from None


def load(name_or_path: str) -> Callable[[str], int]:
    """A function from text to its token count, or a UserError naming `--tokenizer`."""
    tokenizer = load_tokenizer(name_or_path)

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    return count
