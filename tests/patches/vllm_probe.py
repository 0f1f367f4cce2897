"""Probes run in a subprocess against a given vLLM 0.33.0 tree (patched or not).

    PYTHONPATH=<tree>:<repo> python -m tests.patches.vllm_probe config-gate DRAFT_DIR
    PYTHONPATH=<tree>:<repo> python -m tests.patches.vllm_probe block-sizes --tp 2

Each prints one JSON document on its last line. A subprocess per probe keeps the patched and
the installed vLLM out of each other's module cache.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
# DFlash2 drafts need Model Runner V2, which vLLM picks on GPUs; force it on CPU.
os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")


def method_gate(method: str) -> dict[str, Any]:
    """The Qwen4Exp config check on a real VllmConfig whose speculative method is `method`
    (a stand-in speculative config: most methods need a draft checkpoint to build)."""
    import types

    from dflash_ops.plan import vllm_engine
    from dflash_ops.plan.checkpoint import load_checkpoint
    from dflash_ops.plan.model import BlockSizeInputs
    from vllm.model_executor.models.config import Qwen4ExpForConditionalGenerationConfig

    config = vllm_engine.build_vllm_config(
        load_checkpoint(), BlockSizeInputs(gpu="a100", tp=2, k=0)
    )
    config.speculative_config = types.SimpleNamespace(method=method, use_dflash=lambda: False)
    try:
        Qwen4ExpForConditionalGenerationConfig.verify_and_update_config(config)
    except Exception as err:  # the probe reports what vLLM raised, whatever it is
        return {"accepted": False, "error": f"{type(err).__name__}: {err}"}
    return {"accepted": True}


def config_gate(draft_dir: str, k: int, method: str = "dflash") -> dict[str, Any]:
    from dflash_ops.plan import vllm_engine
    from dflash_ops.plan.checkpoint import load_checkpoint
    from vllm.config import CacheConfig, ParallelConfig, VllmConfig
    from vllm.config.speculative import SpeculativeConfig

    vllm_engine._vllm()
    ckpt = load_checkpoint()
    model_config = copy.deepcopy(vllm_engine._model_config(ckpt.source, ckpt.architecture))
    parallel_config = ParallelConfig(tensor_parallel_size=2, enable_expert_parallel=True)
    try:
        speculative = SpeculativeConfig(
            method=method,
            model=draft_dir,
            num_speculative_tokens=k,
            target_model_config=model_config,
            target_parallel_config=parallel_config,
        )
        config = VllmConfig(
            model_config=model_config,
            cache_config=CacheConfig(mamba_cache_mode="align"),
            parallel_config=parallel_config,
            speculative_config=speculative,
        )
    except Exception as err:  # the probe reports what vLLM raised, whatever it is
        return {"accepted": False, "error": f"{type(err).__name__}: {err}"}
    assert config.speculative_config is not None
    return {
        "accepted": True,
        "method": config.speculative_config.method,
        "mamba_ssm_cache_dtype": config.cache_config.mamba_ssm_cache_dtype,
    }


def block_sizes(gpu: str, tp: int, ks: list[int], user_block_size: int | None) -> dict[str, Any]:
    import torch
    from dflash_ops.plan import vllm_engine
    from dflash_ops.plan.checkpoint import load_checkpoint
    from dflash_ops.plan.gpus import gpu_profile
    from dflash_ops.plan.model import BlockSizeInputs
    from vllm.config.vllm import set_current_vllm_config
    from vllm.models.qwen4_exp.common.qsa_cache import QSAKeyStateCache

    v = vllm_engine._vllm()
    hook = _lift_block_size_hook()
    if hook is not None:
        v["Qwen4ExpForPlanning"].get_block_size_alignment_from_config = hook
    ckpt = load_checkpoint()
    alignment = gpu_profile(gpu).prefill_checkpoint_alignment
    qsa_layer_ids = ckpt.attention_layer_ids
    rows = []
    for k in ks:
        config = vllm_engine.build_vllm_config(ckpt, BlockSizeInputs(gpu=gpu, tp=tp, k=k))
        cache_config = config.cache_config
        cache_config.block_size = user_block_size or v["CacheConfig"].DEFAULT_BLOCK_SIZE
        cache_config.user_specified_block_size = user_block_size is not None
        row: dict[str, Any] = {"k": k}
        try:
            with set_current_vllm_config(config):
                # The model's real QSA key rings (one per QSA layer) register themselves in
                # the static forward context, where the patched alignment looks for them.
                rings = [
                    QSAKeyStateCache(
                        head_size=128,
                        dtype=torch.bfloat16,
                        cache_config=cache_config,
                        prefix=f"model.layers.{i}.self_attn.indexer.raw_key_cache",
                        vllm_config=config,
                        compress_ratio=ckpt.indexer_compress_ratio,
                    )
                    for i in qsa_layer_ids
                ]
            with vllm_engine._prefill_checkpoint_alignment(alignment):
                v["PlanningPlatform"].update_block_size_for_backend(config)
            row["block_size"] = cache_config.block_size
            spec = rings[0].get_kv_cache_spec(config)
            row["ring_capacity"] = spec.block_size
            row["spec_ok"] = True
        except (AssertionError, ValueError) as err:
            row["spec_ok"] = False
            row["error"] = f"{type(err).__name__}: {err}"
        rows.append(row)
    return {"rows": rows}


def _lift_block_size_hook() -> Any:
    """The model class's block-size hook from this tree's nvidia model source (the file needs
    GPU kernels to import): `Qwen4ExpForCausalLM.get_block_size_alignment_from_config`, bound
    to the planner's stand-in class. None when the tree has no such hook (unpatched)."""
    import ast
    from pathlib import Path

    import vllm

    source = Path(vllm.__file__).parent / "models" / "qwen4_exp" / "nvidia" / "model.py"
    tree = ast.parse(source.read_text())
    cls = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Qwen4ExpForCausalLM"
    )
    hook = next(
        (
            f
            for f in cls.body
            if isinstance(f, ast.FunctionDef) and f.name == "get_block_size_alignment_from_config"
        ),
        None,
    )
    if hook is None:
        return None
    from vllm.config import VllmConfig
    from vllm.models.qwen4_exp.common.qsa_cache import qsa_ring_capacity

    constants = next(
        n
        for n in tree.body
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "_QSA_LAYER_TYPES"
    )
    namespace: dict[str, Any] = {"VllmConfig": VllmConfig, "qsa_ring_capacity": qsa_ring_capacity}
    exec(
        compile(ast.Module(body=[constants, hook], type_ignores=[]), str(source), "exec"), namespace
    )
    return namespace["get_block_size_alignment_from_config"]


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="probe", required=True)
    gate = sub.add_parser("config-gate")
    gate.add_argument("draft_dir")
    gate.add_argument("--k", type=int, default=7)
    gate.add_argument("--method", default="dflash")
    methods = sub.add_parser("method-gate")
    methods.add_argument("method")
    blocks = sub.add_parser("block-sizes")
    blocks.add_argument("--gpu", default="a100")
    blocks.add_argument("--tp", type=int, default=2)
    blocks.add_argument("--k", type=int, nargs="+", default=list(range(16)))
    blocks.add_argument("--user-block-size", type=int)
    args = parser.parse_args()
    if args.probe == "config-gate":
        result = config_gate(args.draft_dir, args.k, args.method)
    elif args.probe == "method-gate":
        result = method_gate(args.method)
    else:
        result = block_sizes(args.gpu, args.tp, args.k, args.user_block_size)
    sys.stdout.write("\n" + json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
