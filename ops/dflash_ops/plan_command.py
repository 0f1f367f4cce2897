"""`dflash-serve plan`: the block-size and deployment planner."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dflash_ops.plan.gpus import GPUS
from dflash_ops.plan.model import MAX_K


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "plan",
        help="compute the block size vLLM 0.33.0 needs for a Qwen4Exp checkpoint",
        description=(
            "Compute the attention page, the Mamba page, the kernel alignment, the automatic "
            "block size vLLM 0.33.0 picks, the QSA ring capacity and the smallest valid block "
            "size, with the vLLM arguments to use. Uses vLLM 0.33.0's own code when it is "
            "importable, a closed-form model of it otherwise."
        ),
    )
    parser.add_argument(
        "--config",
        help="checkpoint config.json or directory (default: the bundled Qwen3.8-Flash-Next)",
    )
    parser.add_argument("--gpu", default="a100", choices=sorted(GPUS), help="GPU product")
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel size (default 2)")
    parser.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=["auto", "bfloat16", "fp8"],
        help="KV-cache dtype (auto = the model dtype)",
    )
    parser.add_argument(
        "--method",
        default="dflash",
        choices=["dflash", "mtp", "ngram", "off"],
        help="speculative method (default dflash)",
    )
    parser.add_argument(
        "--k",
        default="7",
        help=f"num_speculative_tokens: one value or a range like 4-8 (0..{MAX_K}; default 7)",
    )
    parser.add_argument("--draft-model", help="draft model for the printed vLLM arguments")
    parser.add_argument(
        "--engine",
        default="auto",
        choices=["auto", "vllm", "closed-form"],
        help="auto: vLLM 0.33.0's code when importable, else the closed form",
    )
    parser.add_argument("--gpu-memory-gib", type=float, help="override the GPU's memory")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.90)
    parser.add_argument(
        "--weights-gib",
        type=float,
        help="weights per rank in GiB (default: estimated from the config, AWQ 4-bit experts)",
    )
    parser.add_argument("--draft-weights-gib", type=float, default=1.0)
    parser.add_argument(
        "--format",
        default="table",
        choices=["table", "json", "helm-values"],
        help="output format",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from dflash_ops.plan.checkpoint import load_checkpoint
    from dflash_ops.plan.output import render
    from dflash_ops.plan.planner import make_plan, parse_k

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
        engine=args.engine,
        gpu_memory_gib=args.gpu_memory_gib,
        utilization=args.gpu_memory_utilization,
        weights_gib=args.weights_gib,
        draft_weights_gib=args.draft_weights_gib,
    )
    sys.stdout.write(render(plan, args.format))
    return 0
