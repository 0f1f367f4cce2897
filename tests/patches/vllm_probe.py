"""Probes run in a subprocess against a given vLLM 0.33.0 tree (patched or not).

    PYTHONPATH=<tree>:<repo> python -m tests.patches.vllm_probe config-gate DRAFT_DIR
    PYTHONPATH=<tree>:<repo> python -m tests.patches.vllm_probe block-sizes --tp 2
    PYTHONPATH=<tree>:<repo> python -m tests.patches.vllm_probe prefix-hits --draft sliding

Each prints one JSON document on its last line. A subprocess per probe keeps the patched and
the installed vLLM out of each other's module cache.

    PYTHONPATH=<tree>:<repo> python -m tests.patches.vllm_probe serve

answers probes read from stdin (one JSON argument list per line, one JSON reply per line) in a
forked child each, from a process that has imported vLLM once: the import is most of a probe's
time, and the fork keeps what one probe changes (patched classes, config state) from the next.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import signal
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
    from dflash_ops.plan.checkpoint import load_checkpoint
    from dflash_ops.plan.vllm_engine import runtime
    from vllm.config import CacheConfig, ParallelConfig, VllmConfig
    from vllm.config.speculative import SpeculativeConfig

    runtime.vllm_modules()
    ckpt = load_checkpoint()
    model_config = copy.deepcopy(runtime.checkpoint_model_config(ckpt.source, ckpt.architecture))
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
    from dflash_ops.plan.vllm_engine import runtime
    from vllm.config.vllm import set_current_vllm_config
    from vllm.models.qwen4_exp.common.qsa_cache import QSAKeyStateCache

    v = runtime.vllm_modules()
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
            with runtime.prefill_checkpoint_alignment(alignment):
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


def glm5_next_block_sizes(gpu: str, tp: int, ks: list[int]) -> dict[str, Any]:
    """GLM-5.3-Flash's block sizes through the planner's vLLM engine, in whichever vLLM tree is
    first on the path, and whether that tree has patch 0003's alignment hook."""
    from dflash_ops.plan import glm5_next
    from dflash_ops.plan.model import BlockSizeInputs
    from dflash_ops.plan.vllm_engine import glm5_next as engine
    from vllm.model_executor.models import interfaces

    ckpt = glm5_next.load_glm5_next()
    rows = [
        {
            "k": k,
            "block_size": engine.plan_block_size(
                ckpt, BlockSizeInputs(gpu=gpu, tp=tp, k=k)
            ).automatic_block_size,
        }
        for k in ks
    ]
    hook = hasattr(interfaces.IsHybrid, "get_block_size_alignment_from_config")
    return {"rows": rows, "alignment_hook": hook}


def block_size_grid(
    gpus: list[str], tps: list[int], ks: list[int], user_sizes: list[int]
) -> dict[str, Any]:
    """The block size vLLM's alignment settles on for every GPU x TP x k, automatic (user 0)
    and for each user size; no QSA rings are built (the rule tests compare sizes)."""
    from dflash_ops.plan import vllm_engine
    from dflash_ops.plan.checkpoint import load_checkpoint
    from dflash_ops.plan.gpus import gpu_profile
    from dflash_ops.plan.model import BlockSizeInputs
    from dflash_ops.plan.vllm_engine import runtime

    v = runtime.vllm_modules()
    hook = _lift_block_size_hook()
    if hook is not None:
        v["Qwen4ExpForPlanning"].get_block_size_alignment_from_config = hook
    ckpt = load_checkpoint()
    rows = []
    for gpu in gpus:
        with runtime.prefill_checkpoint_alignment(gpu_profile(gpu).prefill_checkpoint_alignment):
            for tp in tps:
                for k in ks:
                    base = vllm_engine.build_vllm_config(ckpt, BlockSizeInputs(gpu=gpu, tp=tp, k=k))
                    for user in [0, *user_sizes]:
                        config = copy.deepcopy(base)
                        cache_config = config.cache_config
                        cache_config.block_size = user or v["CacheConfig"].DEFAULT_BLOCK_SIZE
                        cache_config.user_specified_block_size = user > 0
                        v["PlanningPlatform"].update_block_size_for_backend(config)
                        rows.append(
                            {"gpu": gpu, "tp": tp, "k": k, "user": user,
                             "block_size": cache_config.block_size}
                        )  # fmt: skip
    return {"rows": rows}


def prefix_hits(
    draft: str, unit: int | None, lengths: list[int], evict: str | None, eagle: bool = False
) -> dict[str, Any]:
    """vLLM's own KVCacheManager over the KV-cache groups of Qwen3.8-Flash-Next on A100 TP2,
    k=7, block 1680 (vllm_engine.kv_cache_groups: vLLM's grouping of every layer's spec), with
    the DFlash2 draft's sliding-window layers, full-attention draft layers, or no draft layers
    (n-gram: the target alone). For each length N, a first request whose prompt is an N-token
    prefix runs and finishes; a second one shares the prefix and continues. Reports the second
    request's prefix-cache hit and the copy-on-write copies its allocation queued per group.
    `evict` drops the first request's draft block that holds the window (`window`) or one below
    it (`below-window`) from the cache before the second lookup. `eagle` runs the managers as
    for an EAGLE-style draft, which drops the last matched hash unit."""
    import random
    import types

    from dflash_ops.plan import closed_form, vllm_engine
    from dflash_ops.plan.checkpoint import load_checkpoint
    from dflash_ops.plan.draft import DEFAULT_DFLASH2_CONFIG, draft_profile_from_config
    from dflash_ops.plan.model import BlockSizeInputs
    from dflash_ops.plan.planner import capacity_inputs
    from vllm.config.vllm import set_current_vllm_config
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_planning import get_kv_cache_configs
    from vllm.v1.core.kv_cache_utils import (
        BlockHashListWithBlockSize,
        generate_scheduler_kv_cache_config,
        get_request_block_hasher,
        init_none_hash,
        resolve_kv_cache_block_sizes,
    )
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request

    ckpt = load_checkpoint()
    plan = closed_form.plan_block_size(ckpt, BlockSizeInputs(gpu="a100", tp=2, k=7))
    profile = None
    if draft != "none":
        config = dict(DEFAULT_DFLASH2_CONFIG)
        if draft == "full":
            config["layer_types"] = None
        profile = draft_profile_from_config(config, "probe")
    method = "dflash" if profile else "ngram"
    inputs = capacity_inputs(
        ckpt, gpu="a100", tp=2, method=method, draft=profile, max_model_len=16384
    ).inputs
    vllm_config, specs, groups = vllm_engine.kv_cache_groups(
        ckpt, plan, method=method, draft=profile, inputs=inputs
    )
    cache_config = vllm_config.cache_config
    cache_config.enable_prefix_caching = True
    cache_config.prefix_match_unit = unit
    with set_current_vllm_config(vllm_config):
        (config,) = get_kv_cache_configs(vllm_config, [specs], [inputs.budget_bytes], groups)
        config = generate_scheduler_kv_cache_config([config])
        scheduler_block_size, hash_block_size = resolve_kv_cache_block_sizes(config, vllm_config)
    hash_fn = get_hash_fn_by_name(cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(hash_block_size, hash_fn)
    group_kind = [
        "draft"
        if g.layer_names[0].startswith("draft.")
        else "attention"
        if g.layer_names[0].endswith("self_attn.attn")
        else "mamba"
        if g.layer_names[0].endswith(("linear_attn", ".ple"))
        else "other"
        for g in config.kv_cache_groups
    ]
    draft_group = group_kind.index("draft") if "draft" in group_kind else None

    def run(
        manager: Any, scheduler: Any, request_id: str, tokens: list[int]
    ) -> tuple[Request, int]:
        """Prefill one request chunk by chunk as the scheduler splits it; return its hit."""
        request = Request(
            request_id, tokens, SamplingParams(max_tokens=1), None, block_hasher=hasher
        )
        blocks, hit, _ = manager.get_computed_blocks(request)
        new_computed = hit
        while request.num_computed_tokens < request.num_tokens:
            manager.new_step_starts()
            remaining = request.num_tokens - request.num_computed_tokens - new_computed
            chunk = Scheduler._mamba_block_aligned_split(
                scheduler, request, min(remaining, scheduler.max_num_scheduled_tokens),
                new_computed,
            )  # fmt: skip
            allocated = manager.allocate_slots(
                request, chunk, new_computed, blocks if new_computed else None
            )
            assert allocated is not None, "no room in the block pool"
            request.num_computed_tokens += new_computed + chunk
            new_computed = 0
        return request, hit

    rng = random.Random(0)
    rows = []
    for n in lengths:
        manager = KVCacheManager(
            config,
            max_model_len=inputs.max_model_len,
            scheduler_block_size=scheduler_block_size,
            hash_block_size=hash_block_size,
            max_in_flight_tokens=vllm_config.max_in_flight_tokens,
            enable_caching=True,
            use_eagle=eagle,
            num_prefill_lookahead=vllm_config.num_prefill_lookahead_tokens,
        )
        prefix = [rng.randrange(1000, 200000) for _ in range(n)]

        # The scheduler's own prefill split (Mamba align mode: chunks end where Mamba state
        # is cached, the prompt's hash-aligned tail included), bound to the scheduler state
        # it reads, as Scheduler.__init__ sets it.
        scheduler = types.SimpleNamespace(
            cache_config=cache_config,
            scheduler_config=vllm_config.scheduler_config,
            hash_block_size=hash_block_size,
            block_size=scheduler_block_size,
            max_num_scheduled_tokens=vllm_config.scheduler_config.max_num_batched_tokens,
            use_eagle_block_drop=eagle,
            num_hash_lookahead_tokens=vllm_config.num_hash_lookahead_tokens,
            mamba_partial_cache_hit=(
                hash_block_size < scheduler_block_size
                and manager.coordinator.enable_partial_hash_hits
            ),
            mamba_has_prefill_checkpoint_blocks=False,  # A100: GDN exports no checkpoints
            mamba_prefill_checkpoint_alignment=None,
            mamba_shared_prefix_checkpoint=False,
        )

        first, _ = run(manager, scheduler, "first", prefix)
        manager.free(first)
        block_size = plan.recommended_block_size
        if evict is not None:
            assert draft_group is not None
            # The draft's window for a hit at the prompt tail starts in the block before the
            # tail's; the blocks below it are not needed.
            window_block = (n - 1) // block_size - 1
            index = window_block if evict == "window" else window_block - 1
            key = BlockHashListWithBlockSize(first.block_hashes, hash_block_size, block_size)
            (block,) = manager.block_pool.get_cached_block(key[index], [draft_group])
            assert manager.block_pool._maybe_evict_cached_block(block)
        row: dict[str, Any] = {"prefix": n}
        if draft_group is not None:
            # The draft group's own finder, before the other groups bound the hit.
            probe = Request(
                "probe", prefix + [7] * 40, SamplingParams(max_tokens=1), None, block_hasher=hasher
            )
            draft_manager = manager.coordinator.single_type_managers[draft_group]
            _, row["draft_group_hit"] = type(draft_manager).find_longest_cache_hit(
                block_hashes=probe.block_hashes,
                max_length=probe.num_tokens - 1,
                kv_cache_group_ids=[draft_group],
                block_pool=manager.block_pool,
                kv_cache_spec=draft_manager.kv_cache_spec,
                drop_eagle_block=eagle,
                alignment_tokens=draft_manager.cache_hit_alignment_tokens,
            )
        _, row["hit"] = run(manager, scheduler, "second", prefix + [7] * 40)
        row["cow_copies"] = {
            kind: len(m.take_pending_cow_copies())
            for kind, m in zip(group_kind, manager.coordinator.single_type_managers, strict=True)
            if kind != "other"
        }
        rows.append(row)
    return {
        "hash_block_size": hash_block_size,
        "scheduler_block_size": scheduler_block_size,
        "partial_hits": manager.coordinator.enable_partial_hash_hits,
        "groups": group_kind,
        "rows": rows,
    }


PREFIX_HIT_SCENARIOS: dict[str, dict[str, Any]] = {
    "target": {"draft": "none"},
    "target-eagle": {"draft": "none", "eagle": True},
    "sliding": {"draft": "sliding"},
    "sliding-eagle": {"draft": "sliding", "eagle": True},
    "sliding-block-aligned": {"draft": "sliding", "unit": None},
    "sliding-evict-window": {"draft": "sliding", "evict": "window", "lengths": [4000]},
    "sliding-evict-below-window": {
        "draft": "sliding",
        "evict": "below-window",
        "lengths": [4000],
    },
    "full": {"draft": "full"},
}


def prefix_hit_scenarios(names: list[str]) -> dict[str, Any]:
    """Several prefix-hits runs in one process (one vLLM import)."""
    results = {}
    for name in names:
        options = {"unit": 16, "lengths": [1000, 2000, 4000], "evict": None, "eagle": False}
        options |= PREFIX_HIT_SCENARIOS[name]
        results[name] = prefix_hits(**options)
    return results


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
    from vllm.models.qwen4_exp.common.qsa_cache import qsa_block_size_alignment

    constants = next(
        n
        for n in tree.body
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "_QSA_LAYER_TYPES"
    )
    namespace: dict[str, Any] = {
        "VllmConfig": VllmConfig,
        "qsa_block_size_alignment": qsa_block_size_alignment,
    }
    exec(
        compile(ast.Module(body=[constants, hook], type_ignores=[]), str(source), "exec"), namespace
    )
    return namespace["get_block_size_alignment_from_config"]


def serve() -> None:
    import tempfile
    import traceback

    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # vLLM logs to stdout: keep the import's lines out of the replies
    import vllm.config
    import vllm.v1.core.kv_cache_manager
    import vllm.v1.core.sched.scheduler  # noqa: F401
    from dflash_ops.plan import vllm_engine  # noqa: F401

    for line in sys.stdin:
        argv = json.loads(line)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                signal.alarm(600)  # a probe that hangs dies (SIGALRM) and fails its test
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                code = 0
                try:
                    main(argv)
                except SystemExit as exit_:
                    code = exit_.code if isinstance(exit_.code, int) else 1
                except BaseException:
                    traceback.print_exc()
                    code = 1
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
            _, status = os.waitpid(pid, 0)
            out.seek(0)
            err.seek(0)
            reply = {
                "returncode": os.waitstatus_to_exitcode(status),
                "stdout": out.read().decode(errors="replace"),
                "stderr": err.read().decode(errors="replace"),
            }
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def main(argv: list[str] | None = None) -> None:
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
    kv = sub.add_parser("kv-invariants")
    kv.add_argument("geometry")
    kv.add_argument("--seeds", type=int, nargs="+", required=True)
    kv.add_argument("--no-guard", action="store_true")
    pipeline = sub.add_parser("kv-pipeline")
    pipeline.add_argument("geometry")
    pipeline.add_argument("--seeds", type=int, nargs="+", required=True)
    pipeline.add_argument("--no-guard", action="store_true")
    pipeline.add_argument("--planted")
    cases = sub.add_parser("kv-cases")
    cases.add_argument("names", nargs="+")
    glm = sub.add_parser("glm5-next-block-sizes")
    glm.add_argument("--gpu", default="h100")
    glm.add_argument("--tp", type=int, default=2)
    glm.add_argument("--k", type=int, nargs="+", default=list(range(16)))
    grid = sub.add_parser("block-size-grid")
    grid.add_argument("--gpu", nargs="+", default=["a100", "h100", "h200", "b200"])
    grid.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4, 8])
    grid.add_argument("--k", type=int, nargs="+", default=list(range(16)))
    grid.add_argument("--user-block-size", type=int, nargs="*", default=[])
    hits = sub.add_parser("prefix-hits")
    hits.add_argument("--draft", choices=["sliding", "full", "none"], default="sliding")
    hits.add_argument("--unit", type=lambda text: None if text == "none" else int(text), default=16)
    hits.add_argument("--lengths", type=int, nargs="+", default=[1000, 2000, 4000])
    hits.add_argument("--evict", choices=["window", "below-window"])
    hits.add_argument("--eagle", action="store_true")
    scenarios = sub.add_parser("prefix-hit-scenarios")
    scenarios.add_argument("names", nargs="+", choices=sorted(PREFIX_HIT_SCENARIOS))
    sub.add_parser("serve")
    args = parser.parse_args(argv)
    if args.probe == "serve":
        serve()
        return
    if args.probe == "config-gate":
        result = config_gate(args.draft_dir, args.k, args.method)
    elif args.probe == "method-gate":
        result = method_gate(args.method)
    elif args.probe == "prefix-hit-scenarios":
        result = prefix_hit_scenarios(args.names)
    elif args.probe == "kv-invariants":
        from tests.patches import kv_cache_harness

        result = {
            "reports": kv_cache_harness.sweep(
                args.geometry, args.seeds, same_step_guard=not args.no_guard
            )
        }
    elif args.probe == "kv-pipeline":
        from tests.patches import kv_cache_pipeline

        result = {
            "reports": kv_cache_pipeline.sweep(
                args.geometry, args.seeds, same_step_guard=not args.no_guard, planted=args.planted
            )
        }
    elif args.probe == "kv-cases":
        from tests.patches import kv_cache_cases

        result = kv_cache_cases.run(args.names)
    elif args.probe == "glm5-next-block-sizes":
        result = glm5_next_block_sizes(args.gpu, args.tp, args.k)
    elif args.probe == "block-size-grid":
        result = block_size_grid(args.gpu, args.tp, args.k, args.user_block_size)
    elif args.probe == "prefix-hits":
        result = prefix_hits(args.draft, args.unit, args.lengths, args.evict, args.eagle)
    else:
        result = block_sizes(args.gpu, args.tp, args.k, args.user_block_size)
    sys.stdout.write("\n" + json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
