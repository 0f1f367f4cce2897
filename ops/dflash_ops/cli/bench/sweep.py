"""`dflash-serve bench sweep`: method x k x load, with a recommendation and pictures."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from dflash_ops.cli.arguments import choice_list, http_url, kubernetes_name, number, number_list
from dflash_ops.cli.bench.flags import (
    add_load_flags,
    add_workload_flags,
    bench_settings,
    check_out,
    load_levels,
    needs_bench_extra,
    prompts_from_file,
)
from dflash_ops.errors import UserError
from dflash_ops.vocabulary import LOCAL_MODELS, MAX_K, SPECULATIVE_METHODS

method_list = choice_list(SPECULATIVE_METHODS, "methods", "dflash,mtp")


def schedule_choice(text: str) -> object:
    """derive, off, sidecar, or a schedule: read here, once (SweepPlan keeps it typed)."""
    from dflash_ops.speculative_schedule import ScheduleError, parse_schedule

    if text in ("derive", "off", "sidecar"):
        return text
    try:
        return parse_schedule(text, MAX_K)
    except ScheduleError as err:
        raise argparse.ArgumentTypeError(f"{err} (or derive, off, or sidecar)") from None


def register(actions: Any) -> None:
    sweep = actions.add_parser(
        "sweep",
        help="sweep method x k x concurrency, recommend a setting, draw the pictures",
        description=(
            "For each speculative setting (--method x --k; k 0 is speculation off) the deployer "
            "brings an engine up with it, then the same benchmark as `bench` runs at every "
            "--concurrency (or --request-rate). Resumable: run the same command again after an "
            "interruption. Writes OUT/sweep.md, OUT/sweep-results.json (figures, the "
            "recommendation, predicted vs measured acceptance), OUT/recommended-values.yaml "
            "(chart values), throughput/latency/acceptance/speed-up PNGs, and every setting's "
            "own results in OUT/points/. --deployer local restarts a local stack of its own "
            "(CPU engine; its draft model stands in for DFlash2); --deployer helm upgrades an "
            "installed release per setting (a rollout and a model load each) and restores its "
            "values at the end or on Ctrl-C."
        ),
    )
    sweep.add_argument(
        "--method",
        type=method_list,
        help="comma-separated methods (local: draft_model or ngram, default draft_model; helm: "
        "dflash, mtp or ngram, default dflash)",
    )
    sweep.add_argument(
        "--k",
        type=number_list(int, 0, MAX_K, low_open=False),
        default=[0, 2, 4],
        help="num_speculative_tokens values; 0 is speculation off (0,2,4)",
    )
    add_load_flags(sweep)
    sweep.add_argument("--model", help="served model name (default: the first in /v1/models)")
    sweep.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY"),
        help="bearer token for an engine started with an API key (default: $OPENAI_API_KEY)",
    )
    sweep.add_argument(
        "--schedule",
        type=schedule_choice,
        default="derive",
        metavar="derive|off|sidecar|RANGES",
        help="derive (default): after the static settings, derive a k schedule (k per running "
        "batch size) from the recommendation at each level and the engine's running batch "
        "there, run it as one more setting and recommend it only if it is within the spread "
        "of the best static setting at every level; off: no schedule; sidecar (with "
        "--step-cost-from): verify the schedule the largest static k's sidecar recommends for "
        "the whole run's traffic; RANGES (e.g. 1-4:4,5-:1): verify this schedule instead",
    )
    sweep.add_argument("--deployer", choices=["local", "helm"], default="local")
    sweep.add_argument(
        "--fresh", action="store_true", help="start over instead of resuming OUT/sweep.json"
    )
    local = sweep.add_argument_group("--deployer local")
    local.add_argument(
        "--state-dir",
        type=Path,
        default=Path(".sweep-stack"),
        help="the sweep's own local stack state (.sweep-stack); never a running user stack",
    )
    local.add_argument(
        "--models",
        choices=LOCAL_MODELS,
        default="tiny",
        help="the local stack's model pair (see `local up --help`): paying is where "
        "speculation pays at low load on a CPU (tiny)",
    )
    local.add_argument("--engine-port", type=number(int, 1, 65535), help="(default: a free port)")
    local.add_argument("--sidecar-port", type=number(int, 1, 65535), help="(default: a free port)")
    local.add_argument(
        "--enforce-eager",
        action="store_true",
        help="no torch.compile: each setting starts sooner, decodes about half as fast",
    )
    local.add_argument(
        "--engine-timeout", type=number(float, 0, 86_400, low_open=True), default=600.0
    )
    local.add_argument(
        "--step-cost-from",
        type=Path,
        metavar="DIR",
        help="an earlier finished sweep of this pair (with the largest --k, at two loads or "
        "more): its fitted step cost goes to the sidecar of the largest static k, which predicts "
        "every k from its last minute of live figures at the end of each level; sweep.md sets "
        "the predictions against the measurements (give each level a minute or more)",
    )
    helm = sweep.add_argument_group("--deployer helm")
    helm.add_argument("--release", type=kubernetes_name, help="the installed release")
    helm.add_argument("--namespace", type=kubernetes_name, default="default")
    helm.add_argument(
        "--chart", help="the chart to upgrade with (default: the one shipped with dflash-serve)"
    )
    helm.add_argument("--helm", help="the helm binary (default: helm on PATH or .cache/bin)")
    helm.add_argument(
        "--base-url",
        type=http_url,
        help="where the release serves, as this machine reaches it (port-forward or ingress)",
    )
    helm.add_argument(
        "--rollout-timeout",
        type=number(float, 60, 86_400),
        default=1800.0,
        help="seconds one setting's rollout and model load may take (1800)",
    )
    add_workload_flags(sweep)
    sweep.set_defaults(handler=run_sweep, repeats=3)


def settings_of(args: argparse.Namespace) -> list[Any]:
    from dflash_ops.bench.sweep.deployers import HELM_SWEEP_METHODS, LOCAL_SWEEP_METHODS, Setting

    allowed = LOCAL_SWEEP_METHODS if args.deployer == "local" else HELM_SWEEP_METHODS
    methods = args.method or [allowed[0]]
    wrong = [m for m in methods if m != "off" and m not in allowed]
    if wrong:
        raise UserError(
            f"--method {','.join(wrong)} cannot run with --deployer {args.deployer}: "
            f"use {', '.join(allowed)} (or off)"
        )
    ks = sorted(set(args.k))
    spec_methods = [m for m in methods if m != "off"]
    found: set[Setting] = set()
    if 0 in ks or "off" in methods:
        found.add(Setting(0, allowed[0]))
    for method in spec_methods:
        found.update(Setting(k, method) for k in ks if k > 0)
    if len(found) < 2:
        raise UserError("a sweep needs at least two settings: give more --k values or methods")
    return sorted(found)


def run_sweep(args: argparse.Namespace) -> int:
    from dflash_ops.bench.core.run_directory import BenchInterrupted
    from dflash_ops.bench.sweep.analysis import table
    from dflash_ops.bench.sweep.run import SweepPlan, run_sweep

    needs_bench_extra()
    settings = settings_of(args)
    if args.schedule == "sidecar" and args.step_cost_from is None:
        raise UserError(
            "--schedule sidecar verifies the sidecar's recommendation: give --step-cost-from DIR "
            "(an earlier sweep) for its step cost"
        )
    levels = load_levels(args)
    run_settings = bench_settings(args)
    prompts = prompts_from_file(args)
    check_out(args.out)
    plan = SweepPlan(
        settings=settings,
        levels=levels,
        bench=run_settings,
        deployer=args.deployer,
        models=args.models if args.deployer == "local" else None,
        schedule=args.schedule,
        step_cost_from=args.step_cost_from,
    )
    deployer = _deployer(args)
    keys = ", ".join(s.key for s in settings)
    print(f"==> sweep: {len(settings)} settings ({keys}) x {len(levels)} levels", file=sys.stderr)
    try:
        analysis = run_sweep(
            args.out, plan, deployer, args.model, args.api_key, prompts, args.fresh
        )
    except (BenchInterrupted, KeyboardInterrupt) as stopped:
        return stopped.code if isinstance(stopped, BenchInterrupted) else 130
    print(table(analysis))
    print(f"wrote {args.out}/sweep.md, sweep-results.json, recommended-values.yaml and the PNGs")
    return 0


def _deployer(args: argparse.Namespace) -> Any:
    from dflash_ops.bench.sweep.deployers import HelmDeployer, LocalDeployer
    from dflash_ops.loopback import free_port

    if args.deployer == "local":
        for flag in ("release", "chart", "helm", "base_url"):
            if getattr(args, flag):
                raise UserError(f"--{flag.replace('_', '-')} is for --deployer helm")
        return LocalDeployer(
            args.state_dir,
            args.engine_port or free_port(),
            args.sidecar_port or free_port(),
            enforce_eager=args.enforce_eager,
            engine_timeout_s=args.engine_timeout,
            models=args.models,
            sidecar=_sidecar_baseline(args),
        )
    from dflash_ops.chart.helm import helm_binary
    from dflash_ops.paths import CHART_DIR

    if args.step_cost_from is not None:
        raise UserError(
            "--step-cost-from reads the local stack's sidecar: it is for --deployer local"
        )
    if args.models != "tiny":
        raise UserError("--models picks the local stack's pair: it is for --deployer local")

    if not args.release or not args.base_url:
        raise UserError("--deployer helm needs --release and --base-url (where it serves)")
    return HelmDeployer(
        release=args.release,
        namespace=args.namespace,
        chart=args.chart or str(CHART_DIR),
        base_url=args.base_url,
        out=args.out,
        timeout_s=args.rollout_timeout,
        helm=args.helm or helm_binary(),
        api_key=args.api_key,
    )


def _sidecar_baseline(args: argparse.Namespace) -> tuple[Path, Any] | None:
    """OUT/sidecar-baseline.yaml from --step-cost-from, for the static setting at the largest k
    (of the first method), checked before any setting runs; with that setting."""
    if args.step_cost_from is None:
        return None
    import yaml

    from dflash_ops.bench.sweep.step_cost_report import sidecar_baseline

    speculative = [s for s in settings_of(args) if s.speculating]
    if not speculative:
        raise UserError("--step-cost-from needs a speculative setting: give --k above 0")
    largest = max(s.k for s in speculative)
    watched = next(s for s in speculative if s.k == largest)
    baseline = sidecar_baseline(args.step_cost_from, watched, args.models)
    args.out.mkdir(parents=True, exist_ok=True)
    path: Path = args.out / "sidecar-baseline.yaml"
    path.write_text(yaml.safe_dump(baseline.model_dump(mode="json")))
    return path, watched
