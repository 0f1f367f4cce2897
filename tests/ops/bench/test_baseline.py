"""A baseline for the sidecar from a benchmark (dflash_ops.bench.core.baseline), and `local up
--baseline` checking it against the stack before anything starts."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml
from dflash_ops.bench.core.baseline import baseline_of, read_baseline
from dflash_ops.bench.core.results import BenchResult, BenchSettings
from dflash_ops.bench.core.runner import Level, Target, run_bench
from dflash_ops.bench.core.sampling import Sampling
from dflash_ops.errors import UserError
from dflash_ops.local import stack


@pytest.fixture(scope="module")
def sampled_run(instant_server: str) -> BenchResult:
    settings = BenchSettings(
        prompt_set="fixed", input_len=32, max_tokens=16, num_requests=8, duration_s=None,
        repeats=1, warmup=0, seed=0, sampling=Sampling(temperature=1.0, ignore_eos=True),
    )  # fmt: skip
    levels = [Level(concurrency=1), Level(concurrency=2)]
    return asyncio.run(run_bench(Target(instant_server, "fake"), levels, settings))


def test_the_baseline_pools_every_level_and_names_the_sampling(sampled_run: BenchResult) -> None:
    baseline = baseline_of(sampled_run, "run")
    specs = [lv.spec_decode for lv in sampled_run.levels if lv.spec_decode]
    assert len(specs) == 2
    drafts = sum(s.drafts for s in specs)
    k = len(specs[0].per_position_acceptance)
    assert baseline.num_speculative_tokens == k and baseline.model == "fake"
    for i in range(k):
        pooled = sum(s.per_position_acceptance[i] * s.drafts for s in specs) / drafts
        assert baseline.per_position_acceptance[i] == pytest.approx(pooled)
    assert baseline.mean_acceptance_length == pytest.approx(
        1 + sum(baseline.per_position_acceptance)
    )
    assert baseline.sampling == "temperature 1, per-request seeds, ignore-eos"
    assert "dataset fixed" in baseline.workload and baseline.source.startswith("run (")


def test_a_baseline_is_read_from_results_a_baseline_or_values(
    sampled_run: BenchResult, tmp_path: Path
) -> None:
    results = tmp_path / "results.json"
    results.write_text(sampled_run.model_dump_json())
    from_results = read_baseline(results)
    alone = tmp_path / "baseline.yaml"
    alone.write_text(yaml.safe_dump(from_results.model_dump(mode="json")))
    values = tmp_path / "recommended-values.yaml"
    values.write_text(
        yaml.safe_dump({"sidecar": {"baseline": from_results.model_dump(mode="json")}})
    )
    assert read_baseline(alone) == read_baseline(values) == from_results


def test_a_run_without_speculation_gives_no_baseline(
    sampled_run: BenchResult, tmp_path: Path
) -> None:
    levels = [lv.model_copy(update={"spec_decode": None}) for lv in sampled_run.levels]
    path = tmp_path / "results.json"
    path.write_text(sampled_run.model_copy(update={"levels": levels}).model_dump_json())
    with pytest.raises(UserError, match="no speculative-decoding figures") as refused:
        read_baseline(path)
    assert "\n" not in str(refused.value)
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"levels": "none"}))
    with pytest.raises(UserError, match=r"not a bench results\.json"):
        read_baseline(broken)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"num_speculative_tokens": 2}, "was measured at k 3, and this stack drafts up to k 2"),
        ({"models": "paying"}, "measured on model 'tiny', and this stack serves 'paying'"),
        ({"method": "off"}, "--method is off"),
    ],
)
def test_local_up_checks_the_baseline_against_the_stack_before_starting(
    sampled_run: BenchResult, tmp_path: Path, overrides: dict[str, object], expected: str
) -> None:
    results = tmp_path / "results.json"
    results.write_text(sampled_run.model_copy(update={"model": "tiny"}).model_dump_json())
    k = baseline_of(sampled_run, "run").num_speculative_tokens
    values: dict[str, object] = {"state_dir": tmp_path / "state", "baseline": results,
                                 "num_speculative_tokens": k} | overrides  # fmt: skip
    config = stack.StackConfig.model_validate(values)
    with pytest.raises(UserError, match=expected):
        stack.up(config)
    assert not list((tmp_path / "state").glob("*.log"))  # nothing started


def test_a_sweep_hands_its_recommendation_a_baseline_the_chart_takes(
    sampled_run: BenchResult, tmp_path: Path
) -> None:
    """The sweep's recommended values with sidecar.baseline (the helm deployer's), rendered by
    the real chart for a release serving the measured model: the sidecar's own loader reads the
    baseline back from the ConfigMap."""
    from dflash_ops.bench.sweep.analysis import analyse, recommended_values, sweep_baseline
    from dflash_ops.bench.sweep.deployers import Setting
    from dflash_ops.chart.helm import helm_template
    from dflash_sidecar.baseline import load_baseline

    k = baseline_of(sampled_run, "run").num_speculative_tokens
    slower = sampled_run.model_copy(deep=True)
    for level in slower.levels:
        level.output_tokens_per_s.mean /= 3
        level.spec_decode = None
    results = {Setting(0, "draft_model"): slower, Setting(k, "dflash"): sampled_run}
    analysis = analyse(results, with_capacity=False)
    baseline = sweep_baseline(analysis, results)
    assert baseline is not None and baseline.num_speculative_tokens == k
    values = tmp_path / "recommended-values.yaml"
    values.write_text(recommended_values(analysis, results, baseline))
    text = values.read_text()
    assert "# sidecar.baseline: the acceptance measured here" in text
    assert "# Measured under sampling temperature 1, per-request seeds, ignore-eos" in text
    rendered = helm_template([values], ["model.servedName=fake"], "dflash", "llm")
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(rendered) if d}
    data = docs[("ConfigMap", "dflash-dflash-serve-sidecar-baseline")]["data"]["baseline.yaml"]
    (tmp_path / "baseline.yaml").write_text(data)
    assert load_baseline(tmp_path / "baseline.yaml", "fake", k) == baseline
    # Measured on another model than the chart's (the local deployer): only named, and only
    # when there is one.
    named = recommended_values(analysis, results, baseline, baseline_in_values=False)
    assert "baseline.yaml (local up --baseline)" in named and "sidecar" not in yaml.safe_load(named)
    assert "baseline.yaml" not in recommended_values(analysis, results, None)
    # Without speculation recommended, no baseline.
    faster_off = {Setting(0, "draft_model"): sampled_run, Setting(k, "dflash"): slower}
    assert sweep_baseline(analyse(faster_off, with_capacity=False), faster_off) is None
