"""Parse rendered `vllm serve` command lines with vLLM 0.33.0's own CLI and engine arguments.

    PYTHONPATH=<patched vllm tree>:<repo> python -m tests.charts.vllm_args_probe CASES.json

CASES.json: a list of {"name", "argv", "profile"} where argv follows `vllm serve` and profile is
the chart's model.profile (default qwen3.8-flash-next). For each, in order: vLLM's `serve`
argument parser (unknown flags and bad values fail here), its pre-load checks
(`validate_parsed_serve_args`), the reasoning and tool-call parser registries, then
`AsyncEngineArgs.create_engine_config()`: a real VllmConfig (and a k schedule's lookup table, as
the scheduler builds it at start-up), with the checkpoint replaced by the profile's bundled
config and the DFlash2 draft by its config fixture (no weights, no hub), which runs the
speculative, Engram (PLE offload, Qwen3.8-Flash-Next's only), parallel and cache configs. Prints
one JSON document (name -> "ok" or the error) on its last line.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# DFlash2 drafts need Model Runner V2, which vLLM picks on GPUs; force it on CPU.
os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "patches" / "fixtures"
# Per chart model.profile: the bundled checkpoint config and the DFlash2 draft's config fixture.
PROFILES = {
    "qwen3.8-flash-next": ("qwen3.8-flash-next.config.json", FIXTURES / "dflash2-draft"),
    "glm-5.3-flash": ("glm-5.3-flash.config.json", FIXTURES / "glm-dflash2-draft"),
}


def local_target(profile: str) -> str:
    directory = Path(tempfile.mkdtemp(prefix="vllm-args-target-"))
    source = REPO / "ops" / "dflash_ops" / "data" / PROFILES[profile][0]
    (directory / "config.json").write_bytes(source.read_bytes())
    return str(directory)


def check(argv: list[str], target: str, profile: str) -> str:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.common.cli_args import validate_parsed_serve_args
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    ServeSubcommand().subparser_init(parser.add_subparsers())
    try:
        args = parser.parse_args(["serve", *argv])
    except SystemExit as exit_:
        return f"vllm serve's argument parser refused the command line (exit {exit_.code})"
    validate_parsed_serve_args(args)
    if args.reasoning_parser and args.reasoning_parser not in (
        ReasoningParserManager.list_registered()
    ):
        return f"unknown reasoning parser {args.reasoning_parser!r}"
    if args.tool_call_parser and args.tool_call_parser not in ToolParserManager.list_registered():
        return f"unknown tool-call parser {args.tool_call_parser!r}"
    spec: dict[str, Any] | None = args.speculative_config
    if spec is not None and spec.get("method") == "dflash":
        spec["model"] = str(PROFILES[profile][1])
    # The checkpoint is replaced by the reference config (no weights, no hub); the reasoning
    # parser needs the real tokenizer, so its name is checked above and dropped here.
    args.model = target
    args.model_tag = None
    args.skip_tokenizer_init = True
    args.reasoning_parser = None
    engine_args = AsyncEngineArgs.from_cli_args(args)
    hook = contextlib.nullcontext()
    if profile == "glm-5.3-flash":
        # The CPU platform's config hook turns prefix caching off for MLA models, which no GPU
        # platform does; vLLM then refuses the align-mode Mamba block --mamba-cache-mode sets.
        from dflash_ops.plan.vllm_engine.glm5_next import cpu_platform_hook_off

        hook = cpu_platform_hook_off()
    with hook:
        config = engine_args.create_engine_config()
    engram = config.engram_config is not None
    if engram != (profile == "qwen3.8-flash-next"):
        return f"--engram-config {'given' if engram else 'missing'} for {profile}"
    spec_config = config.speculative_config
    if spec_config is not None and spec_config.num_speculative_tokens_per_batch_size:
        # What the scheduler builds at start-up (vllm/v1/core/sched/scheduler.py): a schedule
        # the config takes can still fail here.
        from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

        build_dynamic_sd_schedule_lookup(
            spec_config.num_speculative_tokens_per_batch_size,
            vllm_max_batch_size=config.scheduler_config.max_num_seqs,
            vllm_num_speculative_tokens=spec_config.num_speculative_tokens,
        )
    return "ok"


def main() -> None:
    from dflash_ops.plan.vllm_engine import runtime

    # The Qwen4Exp model classes need GPU kernels to import; the planner's stand-in carries
    # the same config hooks (vllm_engine documents what it reproduces).
    v = runtime.vllm_modules()
    print("vLLM imported", file=sys.stderr, flush=True)  # the first progress line
    for architecture in ("Qwen4ExpForConditionalGeneration", "Qwen4ExpMTP"):
        v["ModelRegistry"].register_model(architecture, v["Qwen4ExpForPlanning"])
    # GLM-5.3-Flash's model class needs GPU kernels too; the planner's stand-in answers its
    # state queries with vLLM's own calculators.
    from dflash_ops.plan.vllm_engine.glm5_next import glm_modules

    v["ModelRegistry"].register_model("Glm5NextForCausalLM", glm_modules()["Glm5NextForPlanning"])
    targets = {profile: local_target(profile) for profile in PROFILES}
    results = {}
    for case in json.loads(Path(sys.argv[1]).read_text()):
        profile = case.get("profile", "qwen3.8-flash-next")
        try:
            results[case["name"]] = check(case["argv"], targets[profile], profile)
        except Exception as err:  # the probe reports what vLLM raised, whatever it is
            results[case["name"]] = f"{type(err).__name__}: {err}"
        print(f"checked {case['name']}", file=sys.stderr, flush=True)  # progress, per case
    sys.stdout.write("\n" + json.dumps(results) + "\n")


if __name__ == "__main__":
    main()
