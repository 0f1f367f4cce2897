"""`dflash-serve bench lossless-power`: how often the sampled lossless check raises a false alarm
and how often it finds a planted difference, measured on real engines.

One collection of continuations (the expensive part, with progress) feeds many trials: pools of
seeded continuations per prompt from the reference (the target without speculation) at the
run's temperature, from the speculative endpoint at that temperature, and from the reference
at a planted temperature. Each trial draws `samples` continuations per prompt and side without
replacement within the trial and runs the check's test (two_sample.permutation_test):

- reference against reference (two disjoint draws): every failure is a false alarm;
- speculation against the reference: the check as users run it (fails at about alpha if the
  engine is lossless, far more often if not);
- planted temperature against the reference: every pass is a miss.

Trials share their pools, so they are not independent runs of the engines: the rates describe
the test on these engines' outputs, and the interval printed beside each is Wilson's 95% for
that many trials.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from dflash_ops.errors import UserError

if TYPE_CHECKING:
    from dflash_ops.bench.core.client import Endpoint

Pool = dict[str, list[list[int]]]


class PowerSettings(BaseModel):
    temperature: float = Field(default=1.0, gt=0, le=100)
    planted_temperature: float = Field(default=0.9, gt=0, le=100)
    samples: int = Field(default=200, ge=10, le=10_000, description="per prompt, side and trial")
    prompts: int = Field(default=4, ge=1, le=10)
    tokens: int = Field(default=8, ge=2, le=256)
    trials: int = Field(default=100, ge=1, le=10_000)
    concurrency: int = Field(default=8, ge=1, le=4096)
    alpha: float = Field(default=0.01, gt=0, lt=1)
    permutations: int = Field(default=199, ge=99, le=100_000)
    seed: int = 0


class Rate(BaseModel):
    comparison: str
    counts_as: str
    trials: int
    failures: int
    rate: float
    low: float
    high: float

    def line(self) -> str:
        return (
            f"{self.comparison}: {self.failures}/{self.trials} trials failed = {self.rate:.1%} "
            f"(95% {self.low:.1%}-{self.high:.1%}) {self.counts_as}"
        )


class PowerResult(BaseModel):
    settings: PowerSettings
    pool_sizes: dict[str, int]
    collect_s: float
    seconds_per_test: float
    rates: list[Rate]


def wilson(failures: int, trials: int) -> tuple[float, float]:
    z = 1.959964
    share = failures / trials
    centre = (share + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(share * (1 - share) / trials + z * z / (4 * trials * trials))
    half /= 1 + z * z / trials
    return max(0.0, centre - half), min(1.0, centre + half)


async def collect_pools(
    speculative: Endpoint, reference: Endpoint, model: str, settings: PowerSettings
) -> dict[str, Pool]:
    """The reference pool holds twice a trial's draw (two disjoint draws for the null); the
    others one draw's worth more than a trial takes, so trials differ."""
    from dflash_ops.bench.core.lossless import collect
    from dflash_ops.bench.core.results import SampledCheckSettings
    from dflash_ops.bench.core.sampling import Sampling

    sizes = {"reference": 3 * settings.samples, "speculative": 2 * settings.samples}
    sizes["planted"] = 2 * settings.samples
    sampling = Sampling(temperature=settings.temperature, ignore_eos=True)
    planted = Sampling(temperature=settings.planted_temperature, ignore_eos=True)
    jobs = []
    first_index = 0
    for name, endpoint, how in (
        ("reference", reference, sampling),
        ("speculative", speculative, sampling),
        ("planted", reference, planted),
    ):
        check = SampledCheckSettings(
            prompts=settings.prompts,
            samples=sizes[name],
            tokens=settings.tokens,
            seed=settings.seed,
        )
        jobs.append(collect(endpoint, model, how, check, settings.concurrency, first_index, name))
        first_index += settings.prompts * sizes[name]
    pools = await asyncio.gather(*jobs)
    return dict(zip(("reference", "speculative", "planted"), pools, strict=True))


def run_trials(pools: dict[str, Pool], settings: PowerSettings) -> tuple[list[Rate], float]:
    """The three comparisons' failure rates over `settings.trials` draws each, and the seconds
    one test took on average."""
    from dflash_ops.bench.core.two_sample import permutation_test

    draw = random.Random(settings.seed)
    n = settings.samples
    failures = {"null": 0, "speculative": 0, "planted": 0}
    started = time.perf_counter()
    for trial in range(settings.trials):
        null_a: Pool = {}
        null_b: Pool = {}
        spec: Pool = {}
        spec_ref: Pool = {}
        plant: Pool = {}
        plant_ref: Pool = {}
        for prompt, reference in pools["reference"].items():
            picked = draw.sample(reference, 2 * n)
            null_a[prompt], null_b[prompt] = picked[:n], picked[n:]
            spec[prompt] = draw.sample(pools["speculative"][prompt], n)
            spec_ref[prompt] = draw.sample(reference, n)
            plant[prompt] = draw.sample(pools["planted"][prompt], n)
            plant_ref[prompt] = draw.sample(reference, n)
        pairs: dict[str, tuple[Pool, Pool]] = {
            "null": (null_a, null_b),
            "speculative": (spec, spec_ref),
            "planted": (plant, plant_ref),
        }
        for name, (first, second) in pairs.items():
            outcome = permutation_test(
                first, second, settings.permutations, settings.alpha, seed=settings.seed + trial
            )
            failures[name] += not outcome.same
        if (trial + 1) * 10 // settings.trials != trial * 10 // settings.trials:
            print(
                f"  trials: {trial + 1}/{settings.trials}, {time.perf_counter() - started:.0f}s",
                file=sys.stderr,
            )
    per_test = (time.perf_counter() - started) / (3 * settings.trials)
    t, planted = settings.temperature, settings.planted_temperature
    described = {
        "null": ("reference vs reference", "false alarms"),
        "speculative": ("speculation vs reference", "speculation judged not lossless"),
        "planted": (f"reference at temperature {planted:g} vs {t:g}", "detected"),
    }
    rates = []
    for name, count in failures.items():
        low, high = wilson(count, settings.trials)
        comparison, counts_as = described[name]
        rates.append(
            Rate(
                comparison=comparison,
                counts_as=counts_as,
                trials=settings.trials,
                failures=count,
                rate=count / settings.trials,
                low=low,
                high=high,
            )
        )
    return rates, per_test


def load_pools(path: Path, settings: PowerSettings) -> dict[str, Pool]:
    """Pools saved by an earlier run (--pools): trials again without the engines. Refused in
    one line when they are too small for the draws asked."""
    try:
        pools = json.loads(path.read_text())
        need = {"reference": 2 * settings.samples, "speculative": settings.samples}
        need["planted"] = settings.samples
        for name, size in need.items():
            for prompt, samples in pools[name].items():
                if len(samples) < size:
                    raise UserError(
                        f"--pools {path}: {name} has {len(samples)} continuations of {prompt}, "
                        f"a trial of --samples {settings.samples} draws {size}"
                    )
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as err:
        raise UserError(f"--pools {path}: not a pools file of this command ({err})") from None
    return {name: pools[name] for name in ("reference", "speculative", "planted")}


async def measure(
    base_url: str,
    reference_url: str,
    model: str | None,
    settings: PowerSettings,
    api_key: str | None = None,
    pools_path: Path | None = None,
) -> PowerResult:
    """Collect the pools (or load them from `pools_path`, written there after a collection),
    then run the trials."""
    from dflash_ops.bench.core.client import Endpoint
    from dflash_ops.bench.core.lossless import refuse_speculating_reference

    if pools_path is not None and pools_path.exists():
        print(f"pools from {pools_path} (delete it to collect again)", file=sys.stderr)
        pools = load_pools(pools_path, settings)
        return _trials_of(pools, settings, 0.0)
    speculative = Endpoint(base_url, api_key=api_key)
    reference = Endpoint(reference_url, api_key=api_key)
    try:
        model = await speculative.model_to_use(model)
        await reference.check_model(model)
        await refuse_speculating_reference(reference, "--reference-url")
        started = time.perf_counter()
        pools = await collect_pools(speculative, reference, model, settings)
        collect_s = time.perf_counter() - started
    finally:
        await speculative.aclose()
        await reference.aclose()
    if pools_path is not None:
        pools_path.write_text(json.dumps(pools))
    return _trials_of(pools, settings, collect_s)


def _trials_of(pools: dict[str, Pool], settings: PowerSettings, collect_s: float) -> PowerResult:
    rates, per_test = run_trials(pools, settings)
    return PowerResult(
        settings=settings,
        pool_sizes={name: sum(len(v) for v in pool.values()) for name, pool in pools.items()},
        collect_s=collect_s,
        seconds_per_test=per_test,
        rates=rates,
    )
