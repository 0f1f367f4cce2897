"""Every rendered engine command line, parsed by vLLM 0.33.0's own `vllm serve` parser and turned
into a real VllmConfig (speculative, Engram, parallel, cache configs) with the patch series."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dflash_ops.chart.helm import engine_args_in_render, helm_template
from dflash_ops.chart.values import chart_values
from dflash_ops.paths import PROFILES_DIR

from tests.conftest import REPO_ROOT
from tests.patches.conftest import manifest, patched_vllm, vllm_wheel  # noqa: F401

pytestmark = pytest.mark.vllm033

VARIANTS = {
    "ple-on-device": ["model.pleCpuOffload=false"],
    "fp8-kv": ["engine.kvCacheDtype=fp8"],
    "ngram": ["speculative.method=ngram", "speculative.numSpeculativeTokens=4"],
    "tp4": ["engine.tensorParallelSize=4"],
    "extra-args": ["model.extraArgs={--max-num-seqs=64}"],
    # A k per batch size, as a user sets it (helm --set splits on commas: ';' between ranges).
    "schedule": ["speculative.schedule=1-4:7;5-16:3;17-:0"],
    "schedule-mtp": ["speculative.method=mtp", "speculative.schedule=1-2:3;3-:1"],
}


# GLM-5.3-Flash (model.profile glm-5.3-flash) from its profile, on each GPU it runs on.
GLM_PROFILE = PROFILES_DIR / "h200-tp8-glm-5.3-flash.yaml"
GLM_VARIANTS = {
    "glm-h100-tp8-k15": ["gpu.type=h100", "speculative.numSpeculativeTokens=15"],
    "glm-b200-tp2": ["gpu.type=b200", "engine.tensorParallelSize=2"],
    "glm-b200-fp8-ngram": ["gpu.type=b200", "engine.kvCacheDtype=fp8", "speculative.method=ngram"],
    "glm-off-no-parsers": ["speculative.method=off", "model.reasoningParser=",
                           "model.toolCallParser="],
    "glm-schedule": ["speculative.schedule=1-4:7;5-:3"],
}  # fmt: skip

IDLE_LIMIT_S = 300.0  # one case, vLLM imported, never took a minute even under load
# Importing vLLM (before the first line) took over 300 s once, beside a CI run and other tests
# on two cores; the test's own timeout (1800 s) bounds it.
START_LIMIT_S = 600.0


def run_probe(tree: Path, cases: list[dict[str, Any]], tmp_path: Path) -> dict[str, str]:
    """The probe's verdict per case. It is waited for as long as it makes progress (a line per
    case checked): a fixed budget for the whole run failed on a loaded machine while it still
    worked; only a probe silent for IDLE_LIMIT_S (START_LIMIT_S while it imports vLLM, before
    its first line) is taken for hung."""
    import queue
    import threading

    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.charts.vllm_args_probe", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONPATH": f"{tree}{os.pathsep}{REPO_ROOT}"},
    )
    assert process.stdout is not None and process.stderr is not None
    lines: queue.Queue[str | None] = queue.Queue()
    stderr: list[str] = []
    output: list[str] = []

    def pump() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    reader = threading.Thread(target=lambda: output.append(process.stdout.read()), daemon=True)
    reader.start()
    while True:
        limit = IDLE_LIMIT_S if stderr else START_LIMIT_S
        try:
            line = lines.get(timeout=limit)
        except queue.Empty:
            process.kill()
            raise AssertionError(f"the probe was silent {limit:.0f} s: {stderr[-5:]}") from None
        if line is None:
            break
        stderr.append(line)
    assert process.wait() == 0, "".join(stderr)[-3000:]
    reader.join()
    return json.loads(output[0].strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.timeout(1800)  # run_probe waits while the probe progresses; silence is a hang
def test_every_rendered_command_line_is_accepted_by_vllm_033(
    patched_vllm: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    cases = [
        {
            "name": p.stem,
            "argv": engine_args_in_render(helm_template([p], [], "dflash", "llm")),
            "profile": chart_values([p])["model"]["profile"],
        }
        for p in sorted(PROFILES_DIR.glob("*.yaml"))
    ]
    cases += [
        {"name": name, "argv": engine_args_in_render(helm_template([], sets, "dflash", "llm"))}
        for name, sets in VARIANTS.items()
    ]
    cases += [
        {
            "name": name,
            "argv": engine_args_in_render(helm_template([GLM_PROFILE], sets, "dflash", "llm")),
            "profile": "glm-5.3-flash",
        }
        for name, sets in GLM_VARIANTS.items()
    ]
    # The probe can fail: command lines vLLM 0.33.0 refuses, each for a different reason.
    good = cases[0]["argv"]
    spec_at = good.index("--speculative-config") + 1
    bad = {
        "bad-flag": [*good, "--ple-cpu-offload"],
        "bad-spec-key": [
            *good[:spec_at],
            json.dumps({**json.loads(good[spec_at]), "draft_layers": 5}),
            *good[spec_at + 1 :],
        ],
        "bad-engram": [*good, "--engram-config", '{"offload": true}'],
        "bad-schedule": [
            *good[:spec_at],
            json.dumps(
                {**json.loads(good[spec_at]), "num_speculative_tokens_per_batch_size": [[2, 4, 3]]}
            ),
            *good[spec_at + 1 :],
        ],
        "bad-tool-parser": [*good, "--tool-call-parser", "qwen3-xml"],
    }
    cases += [{"name": name, "argv": argv} for name, argv in bad.items()]
    # GLM-5.3-Flash's command line with Qwen3.8-Flash-Next's flag: the probe tells them apart.
    glm = next(c for c in cases if c["name"] == GLM_PROFILE.stem)
    cases.append(
        {
            "name": "bad-glm-engram",
            "argv": [*glm["argv"], "--engram-config", '{"cpu_offload": true}'],
            "profile": "glm-5.3-flash",
        }
    )
    bad["bad-glm-engram"] = []
    results = run_probe(patched_vllm, cases, tmp_path)
    for name in bad:
        assert results.pop(name) != "ok", name
    assert results == dict.fromkeys(results, "ok")


def swept_values(seed: int) -> tuple[str, str] | None:
    """A random sweep (off and two or three k, at two to four loads, one method) whose derived
    schedule is measured as fast as the best static setting at every level: the
    recommended-values.yaml `bench sweep` writes for it, and the schedule's short form."""
    import random

    from dflash_ops.bench.core.results import RunningBatch
    from dflash_ops.bench.sweep.analysis import analyse, recommended_values
    from dflash_ops.bench.sweep.deployers import Setting
    from dflash_ops.bench.sweep.schedule_derivation import DerivedSchedule, derive_schedule

    from tests.ops.bench.test_sweep import level, result

    rng = random.Random(seed)
    method = rng.choice(["draft_model", "dflash"])
    ks = [0, *sorted(rng.sample(range(1, 16), rng.randint(2, 3)))]
    loads = sorted(rng.sample([1, 2, 4, 8, 16, 32, 64, 128, 256], rng.randint(2, 4)))
    results = {}
    for k in ks:
        levels = []
        for concurrency in loads:
            lv = level(concurrency, rng.uniform(10, 1000), 1.0, 30.0, [0.8] * k)
            batch = concurrency * rng.uniform(0.6, 1.0)
            lv.running_batch = RunningBatch(mean=batch, p50=batch, p90=batch, max=batch, samples=5)
            levels.append(lv)
        results[Setting(k, method)] = result(*levels)
    derived = derive_schedule(analyse(results, with_capacity=False), results)
    if not isinstance(derived, DerivedSchedule):
        return None
    fastest = [
        max((r.levels[i] for r in results.values()), key=lambda lv: lv.output_tokens_per_s.mean)
        for i in range(len(loads))
    ]
    scheduled = Setting(derived.largest_k, method, schedule=tuple(derived.ranges))
    results[scheduled] = result(*fastest)
    analysis = analyse(results, with_capacity=False)
    assert analysis.schedule is not None and analysis.schedule.recommended, seed
    return recommended_values(analysis, results), derived.short_form


@pytest.mark.timeout(1800)  # as above: run_probe waits while the probe progresses
def test_a_sweeps_recommended_schedule_renders_a_command_line_vllm_033_accepts(
    patched_vllm: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """`helm template -f recommended-values.yaml` for the schedules `bench sweep` derives and
    verifies, each command line parsed by vLLM 0.33.0 into a VllmConfig with the scheduler's
    lookup table built from it."""
    from dflash_ops.speculative_schedule import short_form

    cases, schedules = [], {}
    for seed in range(40):
        swept = swept_values(seed)
        if swept is None:
            continue
        text, schedule = swept
        path = tmp_path / f"recommended-values-{seed}.yaml"
        path.write_text(text)
        argv = engine_args_in_render(helm_template([path], [], "dflash", "llm"))
        spec = json.loads(argv[argv.index("--speculative-config") + 1])
        schedules[f"sweep-{seed}"] = schedule
        # The rendered table is the derived one, range for range.
        rendered = tuple(tuple(r) for r in spec["num_speculative_tokens_per_batch_size"])
        assert short_form(rendered) == schedule, seed
        cases.append({"name": f"sweep-{seed}", "argv": argv})
    assert len(cases) >= 15  # most random sweeps derive a schedule
    results = run_probe(patched_vllm, cases, tmp_path)
    assert results == dict.fromkeys(schedules, "ok")
