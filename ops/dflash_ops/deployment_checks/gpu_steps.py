"""The GPU acceptance as named steps: each engine the check starts, in order, with the steps run
against it (and after it stops). `gpu --dry-run` prints them from here: an engine's command line
and, under it, each step's name and first docstring line; every check of the report belongs to
one step."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_ops.deployment_checks.gpu_engine import (
    SAMPLED_CHECK_CONCURRENCY,
    SAMPLED_CHECK_TEMPERATURE,
    Engine,
    Report,
    bench,
    capture_cost_ms,
    first_difference,
    greedy_ids,
    sampled_continuations,
)
from dflash_ops.model_profiles import PROFILES, ModelProfile
from dflash_ops.speculative_schedule import parse_schedule
from dflash_ops.speculative_setting import SpeculativeSetting

# The public DFlash2 draft of Qwen3.8-Flash-Next captures the outputs of layers 5, 15, 25, 35
# and 45, which vLLM names by their next layer.
EXPECTED_AUX_LAYERS = "(6, 16, 26, 36, 46)"
SCHEDULE = "1-2:7,3-:3"


def expected_aux_layers(draft: str, profile: ModelProfile) -> str | None:
    """The aux layers vLLM names for this draft: from its config.json where the draft is a
    directory (vLLM adds 1 to a DFlash draft's target_layer_ids), the public draft's otherwise;
    None when neither is known."""
    config = Path(draft) / "config.json"
    if config.is_file():
        ids = (json.loads(config.read_text()).get("dflash_config") or {}).get("target_layer_ids")
        if ids:
            return str(tuple(i + 1 for i in ids))
    if draft == profile.draft_model == PROFILES["qwen3.8-flash-next"].draft_model:
        return EXPECTED_AUX_LAYERS
    return None


@dataclass
class Run:
    """What the steps share: the flags, the model's profile, the planned block size, the
    report, and what one step measures for a later one."""

    args: argparse.Namespace
    block: int
    profile: ModelProfile = PROFILES["qwen3.8-flash-next"]
    report: Report = field(default_factory=Report)
    results: dict[str, Any] = field(default_factory=dict)
    mean_acceptance: float | None = None
    ids: dict[int, dict[str, list[int]]] = field(default_factory=dict)
    sampled: dict[str, list[list[int]]] = field(default_factory=dict)
    reference_ids: dict[int, dict[str, list[int]]] = field(default_factory=dict)
    sampled_reference: dict[str, list[list[int]]] = field(default_factory=dict)


Step = Callable[[Run, Engine], None]
Final = Callable[[Run], None]


def series_applied(run: Run) -> None:
    """The patch series is applied to the importable vLLM (patches check --require-applied)."""
    run.report.add(
        "series applied",
        "checked",
        "dflash-serve patches check --require-applied",
        subprocess.run(
            [sys.executable, "-m", "dflash_ops.cli", "patches", "check", "--require-applied"]
        ).returncode
        == 0,
    )


def block_size_and_aux_layers(run: Run, engine: Engine) -> None:
    """Started without --block-size, the engine sets the planned block size and names the aux
    layers it captures."""
    text = engine.log_text()
    chosen = re.findall(r"Setting attention block size to (\d+) tokens", text)
    run.report.add(
        "automatic block size (no --block-size)",
        chosen[-1] if chosen else "none",
        f"{run.block} (the plan)",
        bool(chosen) and int(chosen[-1]) == run.block,
    )
    expected = expected_aux_layers(run.args.draft, run.profile)
    if expected is None:
        run.report.add(
            "aux layers", "not checked", "--draft as a directory with its config.json", False
        )
        return
    run.report.add(
        "aux layers",
        "named" if expected in text else "not in the log",
        expected,
        expected in text,
    )


def acceptance(run: Run, engine: Engine) -> None:
    """The fixed prompts at concurrency 1 and 4: mean acceptance length and per-position
    acceptance (required, not skipped when absent)."""
    run.results["dflash"] = bench(engine, run.args, "dflash2", "--concurrency", "1,4")
    c1 = run.results["dflash"]["levels"][0]
    spec = c1["spec_decode"] or {}
    mal = run.mean_acceptance = spec.get("mean_acceptance_length")
    per_pos = spec.get("per_position_acceptance") or []
    run.report.add(
        "mean acceptance length, c=1",
        f"{mal:.2f}" if mal else "none",
        f">= {run.args.min_acceptance} (seed 4.08)",
        mal is not None and mal >= run.args.min_acceptance,
    )
    run.report.add(
        "per-position acceptance",
        ", ".join(f"{p:.2f}" for p in per_pos) or "none",
        "7 positions, position 0 >= 0.5",
        len(per_pos) == 7 and per_pos[0] >= 0.5,
    )


def parsers(run: Run, engine: Engine) -> None:
    """The model's reasoning parser and one tool call through its tool-call parser."""
    import httpx

    from dflash_ops.deployment_checks import helm_test

    report = run.report
    reasoning, tools = run.profile.reasoning_parser, run.profile.tool_call_parser
    with httpx.Client(base_url=engine.url, timeout=run.args.request_timeout) as client:
        for name, check in (
            ("reasoning + answer", helm_test.chat),
            (f"{tools} tool call", helm_test.tool_call),
        ):
            try:
                report.add(name, check(client, "model"), "passes", True)
            except (helm_test.CheckFailed, httpx.HTTPError) as err:
                report.add(name, str(err), "passes", False)
        reply = client.post(
            "/v1/chat/completions",
            json={
                "model": "model",
                "max_tokens": 512,
                "temperature": 0,
                "messages": [{"role": "user", "content": "Is 97 prime? Think first."}],
            },
        )
        message = reply.json()["choices"][0]["message"] if reply.status_code == 200 else {}
        thought = message.get("reasoning_content") or message.get("reasoning")
        report.add(
            f"{reasoning} reasoning parser",
            "reasoning returned" if thought else f"no reasoning field ({reply.status_code})",
            "separate reasoning",
            bool(thought),
        )


def prefix_cache(run: Run, engine: Engine) -> None:
    """A shared system prompt with the draft loaded: prefix-cache hits below one block, and
    fine-grained hits kept beside the sliding-window draft group (patch 0004)."""
    shared = bench(
        engine, run.args, "shared-prefix", "--concurrency", "1", "--prompts", "shared-prefix",
        "--input-len", "700",
    )  # fmt: skip
    hit = (shared["levels"][0]["prefix_cache"] or {}).get("hit_rate")
    run.report.add(
        "prefix-cache hit rate, shared 1,000-token prompt (below one block), draft loaded",
        f"{hit:.2f}" if hit is not None else "not exported",
        f">= {run.args.min_prefix_hit_rate}",
        hit is not None and hit >= run.args.min_prefix_hit_rate,
    )
    disabled = "Disabling fine-grained prefix-cache hits" in engine.log_path.read_text(
        errors="replace"
    )
    run.report.add(
        "fine-grained prefix hits with the sliding-window draft group (patch 0004)",
        "disabled by vLLM" if disabled else "kept",
        "no 'Disabling fine-grained prefix-cache hits' in the log",
        not disabled,
    )


def capture_overhead(run: Run, engine: Engine) -> None:
    """The capture's own GPU work per decode step over the step time (the acceptance step's
    inter-token latency at concurrency 1)."""
    c1 = run.results["dflash"]["levels"][0]
    itl = (c1.get("itl_ms") or {}).get("p50")
    cost = capture_cost_ms(2560, 4, tokens=8, layers=5)
    share = cost / itl if itl else None
    run.report.add(
        "capture overhead per decode step",
        f"{cost:.4f} ms of {itl or 0:.2f} ms"
        + (f" = {100 * share:.3f}%" if share is not None else ""),
        "< 0.5%",
        share is not None and share < 0.005,
    )


def outputs_with_speculation(run: Run, engine: Engine) -> None:
    """Greedy outputs at concurrency 1 and 4, and sampled continuations, for the lossless
    checks."""
    run.ids = {c: greedy_ids(engine, c, run.args.request_timeout) for c in (1, 4)}
    run.sampled = sampled_continuations(engine, 0, run.args.request_timeout)


def outputs_without_speculation(run: Run, engine: Engine) -> None:
    """The same outputs from the engine without speculation (other seeds for the sampled)."""
    run.reference_ids = {c: greedy_ids(engine, c, run.args.request_timeout) for c in (1, 4)}
    run.sampled_reference = sampled_continuations(engine, 10**6, run.args.request_timeout)


def lossless(run: Run) -> None:
    """Greedy outputs token-identical at concurrency 1 and 4, and sampled outputs (temperature
    1, concurrency 4) following the same distribution (bench --check-sampled-lossless's
    test)."""
    from dflash_ops.bench.core.two_sample import permutation_test

    outcome = permutation_test(
        run.sampled, run.sampled_reference, sides=("with speculation", "without")
    )
    where = outcome.findings[0] if outcome.findings else None
    run.report.add(
        f"sampled lossless, temperature {SAMPLED_CHECK_TEMPERATURE:g}, "
        f"concurrency {SAMPLED_CHECK_CONCURRENCY}",
        f"p = {outcome.p_value:.3g}"
        + (f"; {where.prompt} position {where.position}: {where.detail}" if where else ""),
        f"p > {outcome.alpha:g} (the target's distribution)",
        outcome.same,
    )
    for c in (1, 4):
        ids, reference = run.ids[c], run.reference_ids[c]
        diverged = [
            f"{p} at token {first_difference(ids[p], t)}"
            for p, t in reference.items()
            if ids[p] != t
        ]
        empty = [p for p, t in ids.items() if not t]
        run.report.add(
            f"lossless at concurrency {c}",
            f"{len(reference) - len(diverged)}/{len(reference)} identical"
            + (f"; first divergence: {diverged[0]}" if diverged else ""),
            "all token-identical, none empty",
            not diverged and not empty,
        )


def against_mtp(run: Run, engine: Engine) -> None:
    """The MTP-3 baseline on the same prompts: the seed's comparison (DFlash2 4.08 / 224.9 tok/s
    against MTP-3 2.98 / 180.1 at concurrency 1)."""
    run.results["mtp"] = bench(engine, run.args, "mtp3", "--concurrency", "1,4")
    d1, m1 = run.results["dflash"]["levels"][0], run.results["mtp"]["levels"][0]
    d_tps, m_tps = d1["output_tokens_per_s"]["mean"], m1["output_tokens_per_s"]["mean"]
    m_mal = (m1["spec_decode"] or {}).get("mean_acceptance_length")
    mal = run.mean_acceptance
    run.report.add(
        "DFlash2 vs MTP-3 at c=1 (mean acceptance length; tok/s)",
        f"{mal or 0:.2f} vs {m_mal or 0:.2f}; {d_tps:.1f} vs {m_tps:.1f} ({d_tps / m_tps:.2f}x)",
        "seed: 4.08 vs 2.98; 224.9 vs 180.1 (1.25x)",
        mal is not None and m_mal is not None and mal > m_mal and d_tps > m_tps,
    )


def schedule_followed(run: Run, engine: Engine) -> None:
    """DFlash2 with a k schedule (SCHEDULE: k 7 for 1 to 2 running requests, 3 above): the k in
    effect (drafted tokens per draft) at concurrency 1 and 8 follows it."""
    levels = bench(engine, run.args, "dflash2-schedule", "--concurrency", "1,8")["levels"]
    k_at = [(level["spec_decode"] or {}).get("k_in_effect") for level in levels]
    run.report.add(
        f"k schedule {SCHEDULE}: k in effect at concurrency 1 / 8",
        " / ".join(f"{k:.2f}" if k is not None else "none" for k in k_at),
        "7 / 3 to 4 (below 3 running requests only as the level ends)",
        None not in k_at and k_at[0] >= 6.9 and 3.0 <= k_at[1] <= 4.0,  # type: ignore[operator]
    )


# Around the schedule's threshold (k 7 up to 2 running requests, 3 from 3), with long prompts
# whose prefills join the running decodes: vLLM 0.33.0 looks the k up by the number of scheduled
# requests, prefills included, so a prefill can switch k for a step (vLLM issue 49548 reports
# throughput collapsing at a schedule's threshold on GPUs).
THRESHOLD_BENCH = ("--concurrency", "2,3", "--prompts", "random", "--input-len", "2048")
THRESHOLD_MIN_RATIO = 0.9


def threshold_static(run: Run, engine: Engine) -> None:
    """Static k 7 at concurrency 2 and 3 with prefills joining the decodes: the reference for
    the schedule at its threshold."""
    run.results["threshold-static"] = bench(engine, run.args, "threshold-static", *THRESHOLD_BENCH)


def schedule_at_threshold(run: Run, engine: Engine) -> None:
    """The schedule at concurrency 2 and 3 (its threshold) with prefills joining, against static
    k 7 on the same requests: no collapse at the switch."""
    scheduled = bench(engine, run.args, "threshold-schedule", *THRESHOLD_BENCH)["levels"]
    static = run.results["threshold-static"]["levels"]
    ratios = [
        s["output_tokens_per_s"]["mean"] / max(r["output_tokens_per_s"]["mean"], 1e-9)
        for s, r in zip(scheduled, static, strict=True)
    ]
    run.report.add(
        f"k schedule {SCHEDULE} at its threshold with prefills joining, vs static k 7 "
        "(concurrency 2 / 3)",
        " / ".join(f"{r:.2f}x" for r in ratios),
        f">= {THRESHOLD_MIN_RATIO:g}x at both",
        all(r >= THRESHOLD_MIN_RATIO for r in ratios),
    )


@dataclass(frozen=True)
class EngineSteps:
    """An engine the check starts (its speculative setting) and the steps it runs: `during`
    against it, `after` once it is stopped."""

    name: str
    setting: SpeculativeSetting
    during: tuple[Step, ...]
    after: tuple[Final, ...] = ()


BEFORE: tuple[Final, ...] = (series_applied,)
ENGINES = (
    EngineSteps(
        "dflash2", SpeculativeSetting(7, "dflash"),
        (block_size_and_aux_layers, acceptance, parsers, prefix_cache, capture_overhead,
         outputs_with_speculation, threshold_static),
    ),
    EngineSteps(
        "no speculation", SpeculativeSetting(0, "off"), (outputs_without_speculation,), (lossless,)
    ),
    EngineSteps("mtp3", SpeculativeSetting(3, "mtp"), (against_mtp,)),
    EngineSteps(
        "dflash2-schedule", SpeculativeSetting(7, "dflash", parse_schedule(SCHEDULE, 7)),
        (schedule_followed, schedule_at_threshold),
    ),
)  # fmt: skip


def engines_for(profile: ModelProfile) -> tuple[EngineSteps, ...]:
    """The engines and steps that apply to a model: the methods it is served with, and the
    capture overhead only where the series adds the capture (patch 0001, Qwen3.8-Flash-Next)."""
    chosen = []
    for planned in ENGINES:
        if planned.setting.method not in profile.methods:
            continue
        if "0001" not in profile.patches:
            during = tuple(s for s in planned.during if s is not capture_overhead)
            planned = EngineSteps(planned.name, planned.setting, during, planned.after)
        chosen.append(planned)
    return tuple(chosen)


def step_line(step: Step | Final) -> str:
    """A step as the dry run shows it: its name and what it checks."""
    first = " ".join((step.__doc__ or "").split()).split(". ")[0].removesuffix(".")
    return f"{step.__name__}: {first}"


def run_steps(run: Run) -> None:
    """Every step in order; an engine that cannot start, a timeout or a missing figure ends the
    run with a row saying so (the rows before it stand)."""
    try:
        for final in BEFORE:
            final(run)
        for planned in engines_for(run.profile):
            extra = planned.setting.engine_args(run.args.draft)
            with Engine(run.args, planned.name, extra, run.profile) as engine:
                for step in planned.during:
                    step(run, engine)
            for final in planned.after:
                final(run)
    except (RuntimeError, subprocess.TimeoutExpired, OSError, KeyError, ValueError) as err:
        run.report.add("run", f"stopped: {err}", "every step completes", False)
