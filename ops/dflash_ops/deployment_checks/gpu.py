#!/usr/bin/env python3
"""GPU acceptance of the patch series: every claim the docs make about the GPU path, checked
on 2x A100-80GB (or H100) inside the patched image, and printed as one table.

    python -m dflash_ops.deployment_checks.gpu --model /models/Qwen3.8-Flash-Next-AWQ \\
        --draft /models/Qwen3.8-Flash-Next-DFlash2 [--gpu a100] [--dry-run]
    python -m dflash_ops.deployment_checks.gpu --model /models/GLM-5.3-Flash \\
        --draft /models/GLM-5.3-Flash-DFlash2 --gpu h200 --tp 8

The checkpoint's model_type picks the model's profile (dflash_ops.model_profiles): its parsers
and flags, and the engines and steps that apply to it (GLM-5.3-Flash: no MTP-3 baseline, which
it is not served with, and no capture overhead, which is vLLM's own code there).

Engines run one after another (two TP2 engines do not fit on one 2-GPU machine):

1. the series is applied to the importable vLLM;
2. the plan from the checkpoint's own config.json (`dflash-serve plan --config MODEL`);
3. DFlash2 at block 8 (k=7) started *without* --block-size: the engine's own log must set the
   planned block size and use the aux layers (6, 16, 26, 36, 46);
4. the fixed prompts at concurrency 1 and 4: mean acceptance length (>= --min-acceptance),
   output tokens/s and the per-position acceptance (required, not skipped when absent);
5. the reasoning parser (qwen3) and one qwen3_xml tool call;
6. a shared system prompt with the draft loaded: prefix-cache hits below one block;
7. capture overhead: the capture's own GPU work per decode step over the step time;
8. the same engine without speculation: greedy outputs token-identical at concurrency 1 and 4,
   and sampled outputs (temperature 1, concurrency 4) following the same distribution
   (`bench --check-sampled-lossless`'s test, on continuations collected from each engine);
9. the MTP-3 baseline on the same prompts: the seed's comparison (DFlash2 4.08 / 224.9 tok/s
   against MTP-3 2.98 / 180.1 at concurrency 1);
10. DFlash2 with a k schedule (SCHEDULE: k 7 for 1 to 2 running requests, 3 above): the k in
   effect (drafted tokens per draft) at concurrency 1 and 8 follows it;
11. the schedule at its threshold (concurrency 2 and 3) with 2048-token prompts whose prefills
   join the decodes (vLLM counts them in the batch it looks k up by; vLLM issue 49548), against
   static k 7 on the same requests: at least 0.9x at both.

Each numbered item is a named step of gpu_steps.py, run against the engine it names.
`--dry-run` prints the plan, every engine's command line and its steps, without a GPU. Exit
status 0 only if every check passes; a failed engine start, a timeout or a missing metric fails
its check with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from dflash_ops.deployment_checks.gpu_engine import Engine, log, run_json
from dflash_ops.deployment_checks.gpu_steps import BEFORE, Run, engines_for, run_steps, step_line
from dflash_ops.model_profiles import PROFILES, ModelProfile, profile_of_model_type


class EngineDeployer:
    """`bench sweep`'s deployer on this GPU machine: one `vllm serve` per setting."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.engine: Engine | None = None

    def apply(self, setting: Any) -> str:
        self.finish()
        extra = setting.engine_args(self.args.draft)  # only a draft method reads the draft
        self.engine = Engine(self.args, setting.key, extra).__enter__()
        return self.engine.url

    def finish(self) -> None:
        if self.engine is not None:
            self.engine.__exit__(None, None, None)
            self.engine = None

    def live_sidecar(self, setting: Any) -> str | None:
        return None  # a bare engine: no sidecar


REFERENCE_SETTINGS = [("mtp", 3), *(("dflash", k) for k in range(3, 8))]


def reference_table(args: argparse.Namespace) -> int:
    """The reference measurement through `bench sweep`: DFlash2 k 3..7 and MTP-3 at
    concurrency 1 and 4, the 10 fixed prompts, greedy; printed in the reference's layout."""
    from dflash_ops.bench.core.results import BenchSettings
    from dflash_ops.bench.core.runner import Level
    from dflash_ops.bench.core.sampling import Sampling
    from dflash_ops.bench.sweep.analysis import table
    from dflash_ops.bench.sweep.deployers import Setting
    from dflash_ops.bench.sweep.run import SweepPlan, load_results, run_sweep

    plan = SweepPlan(
        settings=[Setting(k, method) for method, k in REFERENCE_SETTINGS],  # type: ignore[arg-type]
        levels=[Level(concurrency=1), Level(concurrency=4)],
        bench=BenchSettings(
            prompt_set="fixed",
            input_len=256,
            max_tokens=256,
            num_requests=10,
            duration_s=None,
            repeats=3,
            warmup=2,
            seed=0,
            request_timeout_s=args.request_timeout,
            sampling=Sampling(temperature=args.temperature, ignore_eos=True),
        ),
        deployer="gpu-acceptance",
        schedule="off",  # the reference's settings only
    )
    out = args.work / "reference-sweep"
    analysis = run_sweep(out, plan, EngineDeployer(args), "model", None, None)
    results = load_results(out, plan)
    print("| setting | block | concurrency | mean acceptance length | output tok/s |")
    print("|---|---:|---:|---:|---:|")
    for setting in plan.settings:
        name = "MTP-3" if setting.method == "mtp" else "DFlash2"
        for level in results[setting].levels:
            spec = level.spec_decode
            mal = spec.mean_acceptance_length if spec and spec.mean_acceptance_length else None
            print(
                f"| {name} | {setting.k + 1} | {level.concurrency} | "
                f"{'n/a' if mal is None else f'{mal:.2f}'} | "
                f"{level.output_tokens_per_s.mean:.1f} ± {level.output_tokens_per_s.stdev:.1f} |"
            )
    print()
    print(table(analysis))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="checkpoint directory (with config.json)")
    parser.add_argument("--draft", required=True, help="the DFlash2 draft (directory or id)")
    parser.add_argument("--gpu", default="a100", choices=["a100", "b200", "h100", "h200"])
    parser.add_argument(
        "--tp",
        type=int,
        default=2,
        help="tensor-parallel size of every engine (default 2; GLM-5.3-Flash in bf16 needs 8)",
    )
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--min-acceptance", type=float, default=3.0)
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="the benchmarks' sampling temperature (0: greedy, as the reference measurement and "
        "--min-acceptance; your traffic's, to see what it gets: lower --min-acceptance with it)",
    )
    parser.add_argument("--min-prefix-hit-rate", type=float, default=0.5)
    parser.add_argument("--startup-timeout", type=int, default=3600)
    parser.add_argument("--request-timeout", type=float, default=600)
    parser.add_argument("--work", type=Path, default=Path("gpu-acceptance"))
    parser.add_argument("--dry-run", action="store_true", help="print the plan and commands")
    parser.add_argument(
        "--reference-table",
        action="store_true",
        help="only reproduce the reference table (DFlash2 k 3..7 and MTP-3 at concurrency 1 "
        "and 4) through bench sweep; resumable in WORK/reference-sweep",
    )
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.reference_table and not args.dry_run:
        return reference_table(args)
    config_path = Path(args.model) / "config.json"
    plan_argv = [
        sys.executable, "-m", "dflash_ops.cli", "plan", "--gpu", args.gpu, "--tp", str(args.tp),
        "--k", "3-7", "--draft-model", args.draft, "--format", "json",
    ]  # fmt: skip
    profile = PROFILES["qwen3.8-flash-next"]
    if config_path.is_file():
        plan_argv += ["--config", str(config_path)]
        profile = model_profile(config_path)
    else:
        log(f"{config_path} not found: planning with the bundled reference config")
    if any(Path(args.model).glob("*.safetensors")):
        plan_argv += ["--weights-from", args.model]
    per_k = planned_block_sizes(run_json(plan_argv))
    block = per_k["7"]
    if args.dry_run:
        print(dry_run(args, block, per_k, profile))
        return 0
    run = Run(args, block, profile)
    run_steps(run)
    (args.work / "results.json").write_text(json.dumps(run.results, indent=2))
    print(run.report.table())
    ok = all(row.ok for row in run.report.rows)
    log("PASS" if ok else "FAIL: see the table above and the engine logs in " + str(args.work))
    return 0 if ok else 1


def model_profile(config_path: Path) -> ModelProfile:
    """The profile of the checkpoint's model type; one line naming it when there is none."""
    from dflash_ops.plan.checkpoint import declared_model_type, read_config

    _, raw = read_config(config_path, "--model")
    model_type = declared_model_type(raw)
    found = profile_of_model_type(model_type)
    if found is None:
        raise SystemExit(
            f"gpu check: error: --model {config_path.parent}: model_type {model_type!r} is "
            f"neither model the check knows ({', '.join(PROFILES)})"
        )
    return found


def planned_block_sizes(plan: dict[str, Any]) -> dict[str, int]:
    """The block size per k of `dflash-serve plan --format json`, whichever model it planned."""
    if "recommended_block_size" in plan:
        return {k: int(v) for k, v in plan["recommended_block_size"].items()}
    return {str(p["k"]): int(p["recommended_block_size"]) for p in plan["plans"]}


def dry_run(
    args: argparse.Namespace, block: int, per_k: dict[str, int], profile: ModelProfile
) -> str:
    """The plan, each engine's command line (a line each, first), then each engine's steps."""
    engines = engines_for(profile)
    lines = [
        f"plan: block size {block} at k=7 ({args.gpu}, TP{args.tp}, {profile.display_name}); "
        f"per k: {per_k}"
    ]
    for planned in engines:
        engine = Engine(args, planned.name, planned.setting.engine_args(args.draft), profile)
        lines.append(f"{planned.name}: {shlex.join(engine.argv)}")
    lines.append("steps:")
    lines += [f"  before the engines: {step_line(step)}" for step in BEFORE]
    for planned in engines:
        lines += [f"  {planned.name}: {step_line(step)}" for step in planned.during]
        lines += [f"  after {planned.name}: {step_line(step)}" for step in planned.after]
    lines.append(
        f"each bench: {sys.executable} -m dflash_ops.cli bench --base-url "
        f"http://127.0.0.1:{args.port} --model model --concurrency 1,4 --max-tokens 256"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
