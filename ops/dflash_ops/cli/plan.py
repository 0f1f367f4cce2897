"""`dflash-serve plan`: the block-size and deployment planner."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from dflash_ops.cli.arguments import number
from dflash_ops.errors import UserError
from dflash_ops.plan.gpus import GPUS
from dflash_ops.plan.kv_capacity import DEFAULT_PROFILE_RESERVE_GIB

if TYPE_CHECKING:
    from dflash_ops.plan.glm5_next import Glm5NextCheckpoint
from dflash_ops.vocabulary import CHART_METHODS, MAX_K


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "plan",
        help="compute the block size vLLM 0.33.0 needs for a Qwen4Exp or GLM-5.3-Flash checkpoint",
        description=(
            "Compute the attention page, the Mamba page, the kernel alignment, the automatic "
            "block size vLLM 0.33.0 picks, the QSA ring capacity and the smallest valid block "
            "size, with the vLLM arguments to use. Uses vLLM 0.33.0's own code when it is "
            "importable, a closed-form model of it otherwise."
        ),
    )
    parser.add_argument(
        "--config",
        help="checkpoint config.json or directory (default: the bundled config of --model)",
    )
    parser.add_argument(
        "--model",
        choices=MODELS,
        help="the model whose bundled config to plan when no --config is given (default "
        "qwen3.8-flash-next)",
    )
    parser.add_argument("--gpu", default="a100", choices=sorted(GPUS), help="GPU product")
    parser.add_argument(
        "--tp", type=number(int, 1, 64), default=2, help="tensor-parallel size (default 2)"
    )
    parser.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=["auto", "bfloat16", "fp8"],
        help="KV-cache dtype (auto = the model dtype)",
    )
    parser.add_argument(
        "--method",
        default="dflash",
        choices=CHART_METHODS,
        help="speculative method (default dflash)",
    )
    parser.add_argument(
        "--k",
        default="7",
        help=f"num_speculative_tokens: one value or a range like 4-8 (0..{MAX_K}; default 7)",
    )
    parser.add_argument(
        "--schedule",
        metavar="RANGES",
        help="a k per running batch size, e.g. 1-4:7,5-16:3,17-:0 (or vLLM's JSON list); goes "
        "with one --k, its largest k, which the block size and KV cache are sized for",
    )
    parser.add_argument("--draft-model", help="draft model for the printed vLLM arguments")
    parser.add_argument(
        "--prefix-match-unit",
        type=number(int, 0, 1 << 20),
        default=16,
        help="prefix-cache hit granularity in tokens (vLLM's --prefix-match-unit; default 16); "
        "0 for whole-block hits",
    )
    parser.add_argument(
        "--engine",
        default="auto",
        choices=["auto", "vllm", "closed-form"],
        help="auto: vLLM 0.33.0's code when importable, else the closed form",
    )
    capacity = parser.add_argument_group(
        "KV capacity", "inputs of the KV-cache plan (all memory per rank, in GiB)"
    )
    capacity.add_argument(
        "--gpu-memory-gib",
        type=number(float, 0, 4096, low_open=True),
        help="GPU memory (default: the GPU product's)",
    )
    capacity.add_argument(
        "--gpu-memory-utilization", type=number(float, 0, 1, low_open=True), default=0.90
    )
    capacity.add_argument(
        "--weights-gib",
        type=number(float, 0, 4096),
        help="target weights per rank (default: estimated from the config, AWQ 4-bit experts; "
        "see --weights-from)",
    )
    capacity.add_argument(
        "--weights-from",
        metavar="DIR",
        help="measure the target weights from a checkpoint directory's *.safetensors",
    )
    capacity.add_argument(
        "--draft-weights-gib",
        type=number(float, 0, 4096),
        help="draft weights per rank (default: estimated from the draft config or MTP module)",
    )
    capacity.add_argument(
        "--draft-config",
        metavar="PATH",
        help="the DFlash draft's config.json or directory: its layer types and window "
        "(default: an assumed layout of the public DFlash2 draft, printed with the plan)",
    )
    capacity.add_argument(
        "--profile-reserve-gib",
        type=number(float, 0, 4096),
        default=DEFAULT_PROFILE_RESERVE_GIB,
        help="activation peak, CUDA graphs and allocator overhead vLLM's profile run takes "
        f"(default {DEFAULT_PROFILE_RESERVE_GIB:g})",
    )
    capacity.add_argument(
        "--max-model-len",
        type=number(int, 1, 1 << 24),
        help="default: the config's max_position_embeddings",
    )
    capacity.add_argument(
        "--max-num-batched-tokens",
        type=number(int, 1, 1 << 24),
        help="default: vLLM 0.33.0's server default for the GPU (A100 2048, H100/H200 8192)",
    )
    capacity.add_argument(
        "--context-lengths",
        default="8k,32k,64k",
        help="request lengths to count concurrent requests at (default 8k,32k,64k)",
    )
    parser.add_argument(
        "--format",
        default="table",
        choices=["table", "json", "helm-values"],
        help="output format",
    )
    parser.set_defaults(handler=run)


def parse_lengths(text: str) -> tuple[int, ...]:
    """`8k,32k,64k` or plain token counts; k means 1024."""
    lengths = []
    for part in text.split(","):
        item = part.strip().lower()
        try:
            value = int(item[:-1]) * 1024 if item.endswith("k") else int(item)
        except ValueError:
            raise UserError(
                f"--context-lengths {text!r}: expected token counts like 8k,32k,65536"
            ) from None
        if value < 1:
            raise UserError(f"--context-lengths {text!r}: lengths must be positive")
        lengths.append(value)
    return tuple(lengths)


def measure_weights_gib(directory: str, tp: int) -> float:
    """The checkpoint's *.safetensors bytes split over the TP ranks (experts over EP ranks)."""
    from pathlib import Path

    root = Path(directory)
    files = sorted(root.glob("*.safetensors")) if root.is_dir() else []
    if not files:
        raise UserError(
            f"--weights-from {directory!r}: no *.safetensors files there; pass the checkpoint "
            "directory, or give --weights-gib"
        )
    return sum(f.stat().st_size for f in files) / tp / 1024**3


# The models whose bundled config --model plans.
MODELS = ("glm-5.3-flash", "qwen3.8-flash-next")
# Flags of the Qwen3.8-Flash-Next plan that GLM-5.3-Flash's does not have yet, with their
# defaults: refused when given.
NOT_FOR_GLM5_NEXT = {"schedule": None}


def capacity_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The KV-capacity inputs of the command line, as `planner.capacity_inputs` takes them."""
    if args.weights_gib is not None and args.weights_from:
        raise UserError("give --weights-gib or --weights-from, not both")
    weights = (
        measure_weights_gib(args.weights_from, args.tp) if args.weights_from else args.weights_gib
    )
    return {
        "gpu_memory_gib": args.gpu_memory_gib,
        "utilization": args.gpu_memory_utilization,
        "weights_gib": weights,
        "draft_weights_gib": args.draft_weights_gib,
        "profile_reserve_gib": args.profile_reserve_gib,
        "max_model_len": args.max_model_len,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "context_lengths": parse_lengths(args.context_lengths),
    }


def run_glm5_next(args: argparse.Namespace, ckpt: Glm5NextCheckpoint) -> int:
    from dflash_ops.plan import glm5_next_report
    from dflash_ops.plan.draft import load_draft_profile
    from dflash_ops.plan.planner import parse_k

    given = [
        "--" + name.replace("_", "-")
        for name, default in NOT_FOR_GLM5_NEXT.items()
        if getattr(args, name) != default
    ]
    if given:
        raise UserError(f"{', '.join(given)}: {glm5_next_report.NOT_PLANNED}; leave {given[0]} out")
    glm5_next_report.check_format(args.format, args.method, args.draft_model)
    plan = glm5_next_report.make_glm5_next_plan(
        ckpt,
        gpu=args.gpu,
        tp=args.tp,
        ks=parse_k(args.k),
        kv_cache_dtype=args.kv_cache_dtype,
        engine=args.engine,
        method=args.method,
        draft=load_draft_profile(args.draft_config) if args.draft_config else None,
        draft_model=args.draft_model,
        prefix_match_unit=args.prefix_match_unit,
        **capacity_arguments(args),
    )
    sys.stdout.write(glm5_next_report.render(plan, args.format))
    return 0


def run(args: argparse.Namespace) -> int:
    from dflash_ops.plan.checkpoint import declared_model_type, load_checkpoint, read_config
    from dflash_ops.plan.draft import load_draft_profile
    from dflash_ops.plan.glm5_next import MODEL_TYPES as GLM5_NEXT_TYPES
    from dflash_ops.plan.glm5_next import load_glm5_next, read_glm5_next
    from dflash_ops.plan.output import render
    from dflash_ops.plan.planner import make_plan, parse_k

    if args.config is None and args.model == "glm-5.3-flash":
        return run_glm5_next(args, load_glm5_next())
    if args.config is not None:
        config_path, raw = read_config(args.config, "checkpoint config")
        model_type = declared_model_type(raw)
        if model_type in GLM5_NEXT_TYPES:
            if args.model not in (None, "glm-5.3-flash"):
                raise UserError(f"--model {args.model}: --config {args.config} is GLM-5.3-Flash")
            return run_glm5_next(args, read_glm5_next(config_path, raw))
        if args.model == "glm-5.3-flash":
            raise UserError(
                f"--model glm-5.3-flash: --config {args.config} is {model_type or 'no model type'}"
            )
    ks = parse_k(args.k)
    ckpt = load_checkpoint(args.config)
    plan = make_plan(
        ckpt,
        gpu=args.gpu,
        tp=args.tp,
        ks=ks,
        kv_cache_dtype=args.kv_cache_dtype,
        method=args.method,
        draft_model=args.draft_model,
        draft=load_draft_profile(args.draft_config) if args.draft_config else None,
        engine=args.engine,
        prefix_match_unit=args.prefix_match_unit,
        schedule=args.schedule,
        **capacity_arguments(args),
    )
    sys.stdout.write(render(plan, args.format))
    return 0
