#!/usr/bin/env python3
"""CPU-safe self check of a patched vLLM 0.33.0: the DFlash support is really in place.

Runs in the image (and in tests, against an unpacked wheel on PYTHONPATH). It imports only the
modules that load without a GPU and reads the GPU-only model files as source.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def fail(message: str) -> None:
    sys.exit(f"self check FAILED: {message}")


def check_ray(expected: str) -> None:
    """The image's Ray: the version the chart's RayCluster names, with the dashboard modules
    of ray[default]."""
    try:
        import ray
        import ray.dashboard  # noqa: F401  (ray[default])
    except ImportError as err:
        fail(f"Ray is not importable: {err}")
    if ray.__version__ != expected:
        fail(f"Ray is {ray.__version__}, the chart expects {expected} (docker/ray-version.txt)")
    print(f"    ray {ray.__version__} with the dashboard")


def main() -> None:
    if os.environ.get("DFLASH_EXPECT_RAY"):
        check_ray(os.environ["DFLASH_EXPECT_RAY"])
    import vllm

    if vllm.__version__ != "0.33.0":
        fail(f"vLLM is {vllm.__version__}, not 0.33.0")
    root = Path(vllm.__file__).parent

    # Patch 1: both backends make Qwen4ExpModel an EagleModelMixin, the causal LM a
    # SupportsEagle3, and the decoder layer hands out its materialized input.
    # Patch 3: both model classes report the QSA ring as a block-size alignment.
    for backend in ("nvidia", "amd"):
        tree = ast.parse((root / "models" / "qwen4_exp" / backend / "model.py").read_text())
        classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}

        def methods(name: str) -> dict[str, ast.FunctionDef]:
            return {f.name: f for f in classes[name].body if isinstance(f, ast.FunctionDef)}

        if "EagleModelMixin" not in {ast.unparse(b) for b in classes["Qwen4ExpModel"].bases}:
            fail(f"{backend}: Qwen4ExpModel does not inherit EagleModelMixin")
        if "_aux_hidden_state" not in methods("Qwen4ExpModel"):
            fail(f"{backend}: Qwen4ExpModel has no aux hidden-state capture")
        if "SupportsEagle3" not in {ast.unparse(b) for b in classes["Qwen4ExpForCausalLM"].bases}:
            fail(f"{backend}: Qwen4ExpForCausalLM does not support EAGLE-3/DFlash drafts")
        layer_args = methods("Qwen4ExpDecoderLayer")["forward"].args
        if "capture_input" not in {a.arg for a in layer_args.args + layer_args.kwonlyargs}:
            fail(f"{backend}: Qwen4ExpDecoderLayer cannot hand out its input")
        for entry in ("Qwen4ExpForCausalLM", "Qwen4ExpForConditionalGeneration"):
            if "get_block_size_alignment_from_config" not in methods(entry):
                fail(f"{backend}: {entry} reports no block-size alignment")

    # Patch 2: the config gate accepts dflash and validates the draft.
    from vllm.model_executor.models import config as model_config

    gate = inspect.getsource(model_config.Qwen4ExpForConditionalGenerationConfig)
    if '"dflash"' not in gate or not hasattr(model_config, "_verify_qwen4_exp_dflash_draft"):
        fail("the Qwen4Exp config gate does not accept dflash drafts")

    # Patch 3: the platform folds the model's alignment into the block size.
    from vllm.models.qwen4_exp.common.qsa_cache import qsa_ring_capacity
    from vllm.platforms.interface import Platform

    if qsa_ring_capacity(4, 7) != 12:
        fail("qsa_ring_capacity(4, 7) != 12")
    align = inspect.getsource(Platform._align_hybrid_block_size)
    if "get_block_size_alignment_from_config" not in align:
        fail("Platform._align_hybrid_block_size ignores the model's block-size alignment")

    # Patch 4: sliding-window groups (the DFlash2 draft's) take fine-grained prefix hits.
    from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager

    if not SlidingWindowManager.supports_fine_grained_hash_lookup:
        fail("SlidingWindowManager still requires block-aligned prefix-cache lookups")

    if importlib.util.find_spec("dflash_patches") is not None:
        print(
            "self check passed: aux capture (nvidia, amd), dflash config gate, QSA block size, "
            "sliding-window prefix hits"
        )
    else:
        print("self check passed")


if __name__ == "__main__":
    main()
