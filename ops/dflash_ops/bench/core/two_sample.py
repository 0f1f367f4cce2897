"""Do two sets of sampled continuations come from one distribution? A permutation test.

The sampled lossless check draws many seeded continuations of a few tokens from fixed prompts on
two endpoints (speculation and the same target without it) and asks whether they follow the same
distribution over token sequences. Design, and why:

- **Position by position, by context.** A sequence's distribution factors into next-token
  distributions given the prefix. At each position t of each prompt, the samples are grouped by
  a context (none: the token's distribution at t; or the token before it), and each group's
  tokens are compared between the two sides with Pearson's chi-square statistic of homogeneity
  (a 2 x tokens table per group, summed over the groups; tokens seen fewer than RARE times in a
  group share one cell). A broken rejection sampler shows up at the positions it decides (t >=
  1: the first token comes from the prefill, where nothing is drafted). Grouping by the whole
  prefix, the exact conditional, splinters the samples into groups of one or two: in a first
  comparison on the paying pair at temperature 1 (200 continuations per side and prompt, a
  reference at temperature 0.9 planted, 20 trials drawn from pools barely larger than a trial),
  detection fell from 0.95 to 0.80 with it, so it is left out. Any
  grouping keeps the test exact, since the labels are what is permuted.
- **Calibrated by permutation, not by the chi-square law.** Continuations are sparse (many groups
  hold a few samples, many tokens are seen once), where the chi-square approximation is wrong in
  either direction. Under the null hypothesis the samples of one prompt are exchangeable between
  the sides, so the labels are permuted within each prompt (one permutation per prompt, applied
  to whole sequences, so the positions stay dependent as they are) and every statistic is
  recomputed: the false-alarm rate is at most alpha by construction, whatever the vocabulary,
  the sample sizes or the number of positions, up to the Monte Carlo error of the p-value, which
  `(1 + count) / (1 + permutations)` keeps on the safe side.
- **Two statistics, one test, then where.** Each site (prompt, position, grouping) is
  standardized by its own permutation mean and spread. The omnibus statistic sums the sites'
  chi-squares (any kind of difference, spread over positions and prompts). The sharpness
  statistic sums, signed, how common (pooled over both sides) the tokens each side drew are: a
  sampler that is too greedy or too flat, the usual way sampling breaks (a temperature applied
  wrongly, drafts accepted too often or too rarely), moves every site the same way, where one
  degree of freedom per site has far more power than the omnibus's many (on the paying pair,
  reference at temperature 0.9 against 1.0, 100 continuations per side, 40 trials drawn from
  pools of 200-400: detection 0.35 with the omnibus alone, 0.48 with both). The check's
  p-value is the permutation distribution's own verdict on the smallest of the statistics'
  p-values (the largest site's too), so combining them costs no level. Where it
  fails, Westfall and Young's max-T adjusted p-values of the chi-squares (from the same
  permutations) name the sites that differ, holding the family-wise error over all sites at
  alpha: no Bonferroni over dependent positions.

Pure computation over token ids (numpy); the collection is in bench/core/lossless.py.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

from dflash_ops.bench.core.results import SiteFinding

TokenSequence = Sequence[int]
# The tokens before a position that its samples are grouped by: none (the position's own
# distribution) and the last one (see the module's docstring for why not all of them).
CONTEXTS = (0, 1)
RARE = 5
OTHER = -1  # the cell of a context's rare tokens
MIN_PERMUTATIONS_PER_ALPHA = 10


class TwoSampleResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    p_value: float
    alpha: float
    permutations: int
    sites: int
    samples_first: int
    samples_second: int
    findings: list[SiteFinding]

    @property
    def same(self) -> bool:
        return self.p_value > self.alpha


class _Site:
    """One (prompt, position, grouping): its chi-square statistic under every label vector."""

    def __init__(self, prompt: str, position: int, statistics: np.ndarray, table: _Table) -> None:
        self.prompt = prompt
        self.position = position
        self.statistics = statistics
        self.table = table


class _Table:
    """The observed counts of one site, kept to say where it differs."""

    def __init__(
        self,
        position: int,
        prefixes: list[tuple[int, ...]],
        cells: list[tuple[int, int]],
        first: np.ndarray,
        total: np.ndarray,
        group_first: np.ndarray,
        group_total: np.ndarray,
    ) -> None:
        self.position = position
        self.prefixes = prefixes
        self.cells = cells
        self.first = first
        self.total = total
        self.group_first = group_first
        self.group_total = group_total

    def largest_difference(self, sides: tuple[str, str]) -> str:
        """The token whose share after some prefix differs most, in standard errors."""
        group = np.array([g for g, _ in self.cells])
        share_first = self.first / np.maximum(self.group_first[group], 1)
        second = self.total - self.first
        group_second = self.group_total - self.group_first
        share_second = second / np.maximum(group_second[group], 1)
        pooled = self.total / self.group_total[group]
        spread = np.sqrt(
            pooled
            * (1 - pooled)
            * (1 / np.maximum(self.group_first[group], 1) + 1 / np.maximum(group_second[group], 1))
        )
        both = (self.group_first[group] > 0) & (group_second[group] > 0) & (spread > 0)
        if not both.any():
            return "the two sides reached different prefixes"
        score = np.where(both, np.abs(share_first - share_second) / np.where(both, spread, 1), 0)
        cell = int(np.argmax(score))
        g, token = self.cells[cell]
        prefix = self.prefixes[g]
        if prefix:
            after = f"after tokens {list(prefix)}"
        else:
            after = "as the first token" if self.position == 0 else "here, whatever came before"
        what = f"token {token}" if token != OTHER else f"tokens seen fewer than {RARE} times"
        return (
            f"{what} {after}: {share_first[cell]:.0%} of {int(self.group_first[g])} "
            f"samples {sides[0]}, {share_second[cell]:.0%} of {int(group_second[g])} {sides[1]}"
        )


class _Labels:
    """A prompt's label vectors (row 0 observed, then the permutations), converted once for
    all its sites: float32 to count tokens (exact for any count here), float64 to weigh."""

    def __init__(self, labels: np.ndarray) -> None:
        self.counting = labels.astype(np.float32)
        self.weighing = labels.astype(np.float64)


def _site_statistics(
    sequences: list[tuple[int, ...]], position: int, context: int, labels: _Labels
) -> tuple[np.ndarray, np.ndarray, _Table]:
    """Pearson's chi-square of homogeneity at `position`, summed over the groups of samples
    whose `context` tokens before it agree, for every row of `labels` (1: the first side)."""
    groups: dict[tuple[int, ...], int] = {}
    cells: dict[tuple[int, int], int] = {}
    cell_of = np.empty(len(sequences), dtype=np.int64)
    keys = [(s[max(position - context, 0) : position], s[position]) for s in sequences]
    # Tokens seen fewer than RARE times after a context (both sides pooled: the same under
    # every permutation) share one cell: they carry almost no evidence and much noise.
    seen = Counter(keys)
    for i, (before, token) in enumerate(keys):
        group = groups.setdefault(before, len(groups))
        kept = token if seen[before, token] >= RARE else OTHER
        cell_of[i] = cells.setdefault((group, kept), len(cells))
    cell_group = np.array([g for g, _ in cells], dtype=np.int64)
    onehot = np.zeros((len(sequences), len(cells)), dtype=np.float32)
    onehot[np.arange(len(sequences)), cell_of] = 1
    first = (labels.counting @ onehot).astype(np.float64)  # rows x cells
    total = onehot.sum(axis=0).astype(np.float64)
    group_total = np.bincount(cell_group, weights=total, minlength=len(groups))
    membership = np.zeros((len(cells), len(groups)))
    membership[np.arange(len(cells)), cell_group] = 1
    group_first = first @ membership  # rows x groups
    r1 = group_first[:, cell_group]
    n = group_total[cell_group]
    r2 = n - r1
    informative = (r1 > 0) & (r2 > 0)
    expected = total * r1 / n
    weight = np.where(informative, n * n / (total * np.where(informative, r1 * r2, 1)), 0)
    statistics = ((first - expected) ** 2 * weight).sum(axis=1)
    # Sharpness: how common, pooled over both sides, the tokens each side drew are. A sampler
    # that is too greedy (a temperature too low, drafts accepted too often) draws the common
    # tokens more often; one too flat, less. One signed number per label vector.
    scores = (total / group_total[cell_group])[cell_of]
    chosen = labels.weighing
    ones = chosen.sum(axis=1)
    sharpness = chosen @ scores / ones - (1 - chosen) @ scores / (len(sequences) - ones)
    table = _Table(
        position, list(groups), list(cells), first[0], total, group_first[0], group_total
    )
    return statistics, sharpness, table


def permutations_for(alpha: float, asked: int) -> int:
    """The permutations a test at `alpha` runs: those asked, raised to 10 / alpha - 1 (the
    smallest p-value the combination gives is a few times 1 / (permutations + 1): alpha must be
    within reach)."""
    return max(asked, math.ceil(MIN_PERMUTATIONS_PER_ALPHA / alpha) - 1)


def _standardized(values: np.ndarray) -> np.ndarray:
    spread = values.std()
    return (values - values.mean()) / spread if spread > 0 else np.zeros_like(values)


def _upper_p(values: np.ndarray) -> np.ndarray:
    """For each label vector, the share of label vectors whose statistic is at least its own."""
    ordered = np.sort(values)
    return (values.size - np.searchsorted(ordered, values - 1e-9, side="left")) / values.size


def permutation_test(
    first: Mapping[str, Sequence[TokenSequence]],
    second: Mapping[str, Sequence[TokenSequence]],
    permutations: int = 999,
    alpha: float = 0.01,
    seed: int = 0,
    sides: tuple[str, str] = ("on the first side", "on the second"),
) -> TwoSampleResult:
    """Test that `first` and `second` (continuations per prompt) follow one distribution.
    Every prompt needs samples on both sides; sequences are cut to the shortest of a prompt.
    `permutations` is raised to 10 / alpha - 1 when it is lower."""
    if permutations < 1:
        raise ValueError("permutations must be at least 1")
    permutations = permutations_for(alpha, permutations)
    if set(first) != set(second) or not first:
        raise ValueError("both sides need samples of the same prompts")
    rng = np.random.default_rng(seed)
    sites: list[_Site] = []
    sharp_rows: list[np.ndarray] = []
    for prompt in first:
        ones, others = list(first[prompt]), list(second[prompt])
        if not ones or not others:
            raise ValueError(f"prompt {prompt}: both sides need samples")
        length = min(len(s) for s in ones + others)
        sequences = [tuple(s[:length]) for s in ones + others]
        observed = np.zeros(len(sequences), dtype=bool)
        observed[: len(ones)] = True
        labels = _Labels(
            np.vstack([observed, rng.permuted(np.tile(observed, (permutations, 1)), axis=1)])
        )
        for position in range(length):
            for context in CONTEXTS:
                if context > position:
                    continue
                statistics, sharpness, table = _site_statistics(
                    sequences, position, context, labels
                )
                sites.append(_Site(prompt, position, statistics, table))
                sharp_rows.append(_standardized(sharpness))
    z = np.array([_standardized(site.statistics) for site in sites])  # sites x label vectors
    omnibus = z.sum(axis=0)
    sharp = np.abs(np.array(sharp_rows).sum(axis=0))
    largest = z.max(axis=0)
    # The statistics' permutation p-values (the sum, the sharpness, the largest site), combined
    # by their minimum, itself calibrated over the same permutations: exact, as strong as the
    # best of them, and never a site named while the check passes.
    smallest = np.minimum(np.minimum(_upper_p(omnibus), _upper_p(sharp)), _upper_p(largest))
    p_value = float((smallest <= smallest[0] + 1e-12).sum() / smallest.size)
    # Per (prompt, position), the grouping with the strongest evidence.
    best: dict[tuple[str, int], tuple[float, _Site]] = {}
    for index, site in enumerate(sites):
        adjusted = float((largest >= z[index, 0] - 1e-9).sum() / largest.size)
        key = (site.prompt, site.position)
        if key not in best or adjusted < best[key][0]:
            best[key] = (adjusted, site)
    ranked = sorted(best.values(), key=lambda pair: (pair[0], pair[1].prompt, pair[1].position))
    chosen = [pair for pair in ranked if pair[0] <= alpha] if p_value <= alpha else []
    if not chosen and p_value <= alpha:
        # The sum over the sites differs while no single site does on its own: where the
        # evidence is strongest (their adjusted p-values say how strong).
        chosen = ranked[:3]
    findings = [
        SiteFinding(
            prompt=site.prompt,
            position=site.position,
            adjusted_p=adjusted,
            detail=site.table.largest_difference(sides),
        )
        for adjusted, site in chosen
    ]
    return TwoSampleResult(
        p_value=p_value,
        alpha=alpha,
        permutations=permutations,
        sites=len(sites),
        samples_first=sum(len(v) for v in first.values()),
        samples_second=sum(len(v) for v in second.values()),
        findings=findings,
    )
