"""Is speculation lossless?

Greedy traffic (`--check-lossless`): outputs must equal those of the same target served without
speculation, token for token, at each concurrency checked (batch shapes change numerics).

Sampled traffic (`--check-sampled-lossless`) has no such witness: speculative decoding promises
the same *distribution* as the target alone, and that rests on the rejection sampler and
everything feeding it (the target's probabilities at the right positions, the recovered and
bonus tokens, the per-request random streams) being exactly right. So the check draws many
seeded continuations of a few tokens from fixed prompts on both endpoints, under the run's
sampling, and tests that they follow one distribution (two_sample.permutation_test: position by
position, alone and after the token before, calibrated by permutation, so a false alarm has
probability at most alpha). Each side's requests run at the concurrency checked, both sides at
once, with disjoint seeds (independent samples); every request generates exactly `tokens` tokens
(ignore_eos), so the positions of all samples line up."""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass

from dflash_ops.bench.core.client import Endpoint
from dflash_ops.bench.core.prompts import fixed_prompts
from dflash_ops.bench.core.results import (
    LosslessCheck,
    SampledCheckSettings,
    SampledLosslessCheck,
)
from dflash_ops.bench.core.sampling import Sampling, request_seed
from dflash_ops.bench.core.two_sample import permutation_test
from dflash_ops.errors import UserError


@dataclass(frozen=True)
class Reference:
    """The endpoint a lossless check compares greedy outputs with (the same model served without
    speculation), its model (default: the target's) and the concurrencies compared at."""

    url: str
    model: str | None = None
    concurrency: tuple[int, ...] = (1, 4)
    sampled: SampledCheckSettings | None = None
    """Set: the sampled check against this endpoint (the run's sampling on both sides)."""


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


def refuse_greedy(sampling: Sampling) -> None:
    if sampling.greedy:
        raise UserError(
            "--check-sampled-lossless compares sampled outputs, and the run is greedy "
            "(--temperature 0): pass the temperature your traffic uses (e.g. --temperature 1), "
            "or check greedy traffic with --check-lossless"
        )


async def refuse_speculating_reference(reference: Endpoint, flag: str) -> None:
    """A reference for sampled outputs must serve without speculation: one that exports
    speculative counters is refused before anything is collected from it."""
    if await reference.counters() is not None:
        raise UserError(
            f"the sampled lossless reference {reference.base_url} exports speculative decoding "
            f"counters: it serves with speculation. Point {flag} at the same model served "
            "without --speculative-config."
        )


async def collect(
    endpoint: Endpoint,
    model: str,
    sampling: Sampling,
    settings: SampledCheckSettings,
    concurrency: int,
    first_seed_index: int,
    label: str,
) -> dict[str, list[list[int]]]:
    """`settings.samples` continuations of each of the first `settings.prompts` fixed prompts,
    seeded from index `first_seed_index` on; a progress line per quarter."""
    prompts = fixed_prompts()[: settings.prompts]
    limit = asyncio.Semaphore(concurrency)
    total = len(prompts) * settings.samples
    done = 0
    started = time.perf_counter()

    async def one(prompt: tuple[str, str], index: int) -> tuple[str, list[int]]:
        nonlocal done
        prompt_id, text = prompt
        seed = request_seed(settings.seed, first_seed_index + index)
        async with limit:
            tokens = await endpoint.chat_token_ids(
                model, [{"role": "user", "content": text}], settings.tokens, sampling, seed
            )
        if len(tokens) < settings.tokens:
            raise UserError(
                f"{endpoint.base_url} returned {len(tokens)} token ids for {prompt_id}, not "
                f"{settings.tokens}: the check needs `return_token_ids` and `ignore_eos` (a "
                "vLLM server honours both)"
            )
        done += 1
        if done * 4 // total != (done - 1) * 4 // total:
            print(
                f"  {label}: {done}/{total} continuations, {time.perf_counter() - started:.0f}s",
                file=sys.stderr,
            )
        return prompt_id, tokens[: settings.tokens]

    jobs = [
        one(prompt, p * settings.samples + i)
        for i in range(settings.samples)
        for p, prompt in enumerate(prompts)
    ]
    samples: dict[str, list[list[int]]] = {prompt_id: [] for prompt_id, _ in prompts}
    for prompt_id, tokens in await asyncio.gather(*jobs):
        samples[prompt_id].append(tokens)
    return samples


async def check_sampled_lossless(
    endpoint: Endpoint,
    reference: Endpoint,
    model: str,
    reference_model: str,
    sampling: Sampling,
    concurrency: list[int],
    settings: SampledCheckSettings | None = None,
    reference_sampling: Sampling | None = None,
) -> list[SampledLosslessCheck]:
    """One test per concurrency, each at alpha / (number of concurrencies), so the run's
    false-alarm rate stays at most alpha. `reference_sampling` (default: `sampling`) exists to
    plant a difference when the check's power is measured (bench/lossless_power.py)."""
    settings = settings or SampledCheckSettings()
    refuse_greedy(sampling)
    alpha = settings.alpha / max(len(concurrency), 1)
    await refuse_speculating_reference(reference, "--check-sampled-lossless")
    checks = []
    per_side = settings.prompts * settings.samples
    for index, level in enumerate(concurrency):
        print(
            f"  sampled lossless check at concurrency {level}: {per_side} continuations of "
            f"{settings.tokens} tokens per side",
            file=sys.stderr,
        )
        started = time.perf_counter()
        base = 2 * index * per_side
        ours, theirs = await asyncio.gather(
            collect(endpoint, model, sampling, settings, level, base, "speculative"),
            collect(
                reference,
                reference_model,
                reference_sampling or sampling,
                settings,
                level,
                base + per_side,
                "reference",
            ),
        )
        outcome = permutation_test(
            ours,
            theirs,
            settings.permutations,
            alpha,
            seed=settings.seed + index,
            sides=("with speculation", "on the reference"),
        )
        checks.append(
            SampledLosslessCheck(
                reference_url=reference.base_url,
                sampling=sampling.describe(),
                concurrency=level,
                prompts=len(ours),
                samples_per_side=settings.samples,
                tokens=settings.tokens,
                alpha=alpha,
                p_value=outcome.p_value,
                permutations=outcome.permutations,
                findings=outcome.findings,
                seconds=time.perf_counter() - started,
            )
        )
    return checks
