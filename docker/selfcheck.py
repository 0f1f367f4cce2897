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


def main() -> None:
    import vllm

    if vllm.__version__ != "0.33.0":
        fail(f"vLLM is {vllm.__version__}, not 0.33.0")
    root = Path(vllm.__file__).parent

    # Patch 1: both backends make Qwen4ExpModel an EagleModelMixin and capture aux states.
    for backend in ("nvidia", "amd"):
        tree = ast.parse((root / "models" / "qwen4_exp" / backend / "model.py").read_text())
        classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        model = classes["Qwen4ExpModel"]
        if "EagleModelMixin" not in {ast.unparse(b) for b in model.bases}:
            fail(f"{backend}: Qwen4ExpModel does not inherit EagleModelMixin")
        methods = {f.name for f in model.body if isinstance(f, ast.FunctionDef)}
        if "_aux_hidden_state" not in methods:
            fail(f"{backend}: Qwen4ExpModel has no aux hidden-state capture")
        for entry in ("Qwen4ExpForCausalLM", "Qwen4ExpForConditionalGeneration"):
            names = {f.name for f in classes[entry].body if isinstance(f, ast.FunctionDef)}
            if "set_aux_hidden_state_layers" not in names:
                fail(f"{backend}: {entry} does not implement set_aux_hidden_state_layers")

    # Patch 2: the config gate accepts dflash and validates the draft.
    from vllm.model_executor.models import config as model_config

    gate = inspect.getsource(model_config.Qwen4ExpForConditionalGenerationConfig)
    if '"dflash"' not in gate or not hasattr(model_config, "_verify_qwen4_exp_dflash_draft"):
        fail("the Qwen4Exp config gate does not accept dflash drafts")

    # Patch 3: the QSA ring joins the block-size alignment.
    from vllm.models.qwen4_exp.common.qsa_cache import qsa_ring_capacity
    from vllm.platforms.interface import Platform

    if qsa_ring_capacity(4, 7) != 12:
        fail("qsa_ring_capacity(4, 7) != 12")
    if "qsa_ring_capacity" not in inspect.getsource(Platform._align_hybrid_block_size):
        fail("Platform._align_hybrid_block_size ignores the QSA ring capacity")

    if importlib.util.find_spec("dflash_patches") is not None:
        print("self check passed: aux capture (nvidia, amd), dflash config gate, QSA block size")
    else:
        print("self check passed")


if __name__ == "__main__":
    main()
