"""Is speculation lossless? Greedy outputs must equal those of the same target served without
speculation, token for token, at each concurrency checked (batch shapes change numerics)."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass

from dflash_ops.bench.core.client import Endpoint
from dflash_ops.bench.core.prompts import fixed_prompts
from dflash_ops.bench.core.results import LosslessCheck
from dflash_ops.errors import UserError


@dataclass(frozen=True)
class Reference:
    """The endpoint a lossless check compares greedy outputs with (the same model served without
    speculation), its model (default: the target's) and the concurrencies compared at."""

    url: str
    model: str | None = None
    concurrency: tuple[int, ...] = (1, 4)


async def check_lossless(
    endpoint: Endpoint,
    reference: Endpoint,
    model: str,
    reference_model: str,
    max_tokens: int,
    concurrency: list[int],
) -> LosslessCheck:
    """Greedy outputs with speculation must equal the reference's token for token, at each
    concurrency (batch shapes change numerics); the reference must not speculate, and both
    sides must return tokens."""
    prompts = fixed_prompts()
    mismatches: list[str] = []
    checked = identical = 0
    ref_before = await reference.counters()
    for level in concurrency:
        limit = asyncio.Semaphore(level)

        async def both(
            prompt_id: str, text: str, limit: asyncio.Semaphore = limit
        ) -> tuple[str, list[int], list[int]]:
            messages = [{"role": "user", "content": text}]
            async with limit:
                ours, theirs = await asyncio.gather(
                    endpoint.chat_token_ids(model, messages, max_tokens),
                    reference.chat_token_ids(reference_model, messages, max_tokens),
                )
            return prompt_id, ours, theirs

        print(f"  lossless check at concurrency {level}: {len(prompts)} prompts", file=sys.stderr)
        for prompt_id, ours, theirs in await asyncio.gather(*(both(i, t) for i, t in prompts)):
            checked += 1
            if not ours or not theirs:
                raise UserError(
                    f"the lossless check needs token ids, and {prompt_id} returned none from "
                    f"{endpoint.base_url if not ours else reference.base_url} (a vLLM server "
                    "returns them for `return_token_ids`)"
                )
            if ours == theirs:
                identical += 1
                continue
            first = next(
                (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
                min(len(ours), len(theirs)),
            )
            mismatches.append(
                f"{prompt_id} at concurrency {level}: first differing token at {first}"
            )
    ref_after = await reference.counters()
    if ref_after is not None and (ref_before is None or ref_after.drafts > ref_before.drafts):
        raise UserError(
            f"the lossless reference {reference.base_url} drafted tokens during the check: it "
            "serves with speculative decoding. Point --check-lossless at the same model served "
            "without --speculative-config."
        )
    return LosslessCheck(
        reference_url=reference.base_url,
        concurrency=concurrency,
        prompts=checked,
        identical=identical,
        mismatches=mismatches,
    )
