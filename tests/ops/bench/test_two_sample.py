"""The permutation test of the sampled lossless check, on samplers whose truth is known."""

from __future__ import annotations

import numpy as np
import pytest
from dflash_ops.bench.core.two_sample import permutation_test

VOCAB = 10


def chain(seed: int, samples: int, length: int = 5, prompts: int = 2, **bias: float) -> dict:
    """Continuations of a fixed Markov chain; `sharpen` plants a broken sampler at `at`: that
    share of the tokens there is the most likely one instead of a sample."""
    draw = np.random.default_rng(seed)
    out = {}
    for prompt in range(prompts):
        logits = np.random.default_rng(100 + prompt).normal(scale=2.0, size=(VOCAB, VOCAB))
        rows = []
        for _ in range(samples):
            previous, tokens = prompt, []
            for position in range(length):
                weights = np.exp(logits[previous] - logits[previous].max())
                token = int(draw.choice(VOCAB, p=weights / weights.sum()))
                if position == bias.get("at", -1) and draw.random() < bias.get("sharpen", 0):
                    token = int(np.argmax(logits[previous]))
                tokens.append(token)
                previous = token
            rows.append(tokens)
        out[f"prompt-{prompt}"] = rows
    return out


def test_two_samplers_that_are_the_same_raise_few_false_alarms() -> None:
    """The permutation calibration holds the level: over 60 trials at alpha 0.1, the false
    alarms stay within what a 10% rate allows (binomial: 15 or more has probability < 0.2%)."""
    alarms = sum(
        not permutation_test(
            chain(2 * trial, 60), chain(2 * trial + 1, 60), permutations=99, alpha=0.1, seed=trial
        ).same
        for trial in range(60)
    )
    assert alarms <= 14, alarms


def test_a_sampler_broken_at_one_position_fails_and_that_position_is_named() -> None:
    """A planted defect at position 2 only (half of its tokens forced to the argmax) is
    found, and the named sites are at position 2: positions 0 and 1 are the same on both."""
    result = permutation_test(
        chain(1, 300), chain(2, 300, at=2, sharpen=0.5), permutations=499, alpha=0.01
    )
    assert not result.same and result.p_value <= 0.01
    assert result.findings and {f.position for f in result.findings} == {2}, result.findings
    assert "samples on the first side" in result.findings[0].detail


def test_the_same_samples_on_both_sides_pass_and_the_result_repeats() -> None:
    samples = chain(3, 80)
    first = permutation_test(samples, samples, permutations=199, seed=5)
    assert first.same and first.p_value > 0.5 and not first.findings
    assert permutation_test(samples, samples, permutations=199, seed=5) == first


def test_sides_must_cover_the_same_prompts() -> None:
    with pytest.raises(ValueError, match="same prompts"):
        permutation_test({"a": [[1, 2]]}, {"b": [[1, 2]]})
    with pytest.raises(ValueError, match="both sides need samples"):
        permutation_test({"a": [[1, 2]]}, {"a": []})
