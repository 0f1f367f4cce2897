"""The local stack's configuration (`StackConfig`: what `local up` starts, from its flags) and
its state (`StackState` in `state.json`: the processes that run, replaced atomically)."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dflash_ops.errors import UserError
from dflash_ops.local import keys
from dflash_ops.local.supervisor import (
    ProcessRecord,
)
from dflash_ops.speculative_setting import ScheduleValue, SpeculativeSetting, fits
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

    # Field descriptions are `local up`'s help (cli.config_flags makes a flag per field).
    state_dir: Path = Path(".local-stack")
    host: str = Field(
        default="127.0.0.1",
        description="listen address of every component (0.0.0.0 in a container)",
    )
    engine_port: int = Field(
        default=8000,
        ge=1,
        le=65535,
        description="the OpenAI API: the engine's port, or the router's with --replicas > 1",
    )
    sidecar_port: int = Field(
        default=9100, ge=1, le=65535, description="the sidecar's port (+ i for replica i)"
    )
    prometheus_port: int = Field(default=9090, ge=1, le=65535, description="Prometheus's port")
    method: LocalMethod = Field(
        default="draft_model",
        description="speculative decoding: draft_model (the pair's draft), ngram (prompt "
        "lookup) or off",
    )
    models: LocalModels = Field(
        default="tiny",
        description="the model pair, served under its name: tiny (starts fastest; its draft is "
        "the target plus noise, as costly as the target, so speculation never pays here) or "
        "paying (a ~180M bfloat16 target and a draft of its first 2 layers: speculation pays "
        "at low load, as on a GPU; start it with --enforce-eager)",
    )
    num_speculative_tokens: int = Field(
        default=4,
        ge=1,
        le=MAX_K,
        description="num_speculative_tokens: the tokens drafted per step",
        json_schema_extra={"flag": "--k"},
    )
    schedule: ScheduleValue = Field(
        default=None,
        description="a k per running batch size, e.g. 1-2:4,3-:1 (k 4 for 1 to 2 running "
        "requests, 1 above) or vLLM's JSON [[1,2,4],[3,64,1]]; --k stays the largest k",
        json_schema_extra={"metavar": "RANGES"},
    )
    draft_noise: float | None = Field(
        default=None,
        ge=0.0,
        le=10.0,
        description="Gaussian noise x each weight's std added to the draft's source: the tiny "
        "pair's target (default 0.05; 0: the draft is the target) or the paying pair's own "
        "draft (default none, the real draft; 10 makes a draft that is noise, as a broken "
        "capture would)",
    )
    prometheus: bool = Field(default=True, description="no Prometheus (it starts if installed)")
    engine_timeout_s: float = Field(
        default=600.0,
        gt=0,
        le=24 * 3600,
        description="seconds the engine may take to start",
        json_schema_extra={"flag": "--engine-timeout"},
    )
    kv_cache_gib: int = Field(default=1, json_schema_extra={"flag": False})
    enforce_eager: bool = Field(
        default=False,
        description="vLLM without torch.compile: decodes about half as fast and starts about "
        "as fast (engine init 3 s against 4.5 s compiled, here)",
    )
    scale_out: bool = Field(
        default=False,
        json_schema_extra={"flag": False},
        description="--enable-scale-out: the render endpoints vllm-router's cache_aware policy "
        "tokenizes requests with (vLLM answers them 403 otherwise)",
    )
    replicas: int = Field(
        default=1,
        ge=1,
        le=8,
        description="engines, a sidecar each; more than one: vLLM's router in front of them on "
        "--engine-port, the engines on --replica-base-port + i and the sidecars on "
        "--sidecar-port + i",
    )
    kv_events_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="publish the engine's KV-cache events on tcp://127.0.0.1:PORT (ZMQ), for "
        "vllm-router's kv_aware policy; one engine only",
        json_schema_extra={"flag": False},
    )
    replica_base_port: int = Field(
        default=8100,
        ge=1,
        le=65535 - 8,
        description="with --replicas > 1, the engines listen on this + i",
    )
    router_metrics_port: int = Field(
        default=29000, ge=1, le=65535, description="the router's /metrics port"
    )
    router_policy: StandingRouterPolicy = Field(
        default="cache_aware",
        description="the router's policy with --replicas > 1 (cache_aware: by prefix)",
    )
    auth: bool = Field(
        default=False,
        json_schema_extra={"flag": False},  # local up's --auth: from the key it is given
        description="the chart's door (nginx) in front of every engine and the router, checking "
        "the API key in keys_dir; what it guards listens on door_base_port + i",
    )
    door_base_port: int = Field(
        default=8200,
        ge=1,
        le=65535 - 9,
        description="with a key: vLLM (and the router) listen here + i on loopback, behind the "
        "doors",
    )
    max_model_len: int = Field(
        default=2048, ge=256, le=8192, description="vLLM's --max-model-len (prompt + output)"
    )
    baseline: Path | None = Field(
        default=None,
        description="the acceptance a healthy deployment showed on your traffic (a baseline "
        "file, a recommended-values.yaml with sidecar.baseline, or a bench results.json, of "
        "this pair at this k, sampled as your traffic is): the sidecars' verdict and the "
        "collapse alert judge against it instead of greedy constants",
        json_schema_extra={"metavar": "FILE"},
    )
    sidecar_scrape_interval: float | None = Field(
        default=None,
        gt=0,
        le=60,
        json_schema_extra={"flag": False},  # the sweep's: a busy scrape a second for its windows
        description="the sidecars' --scrape-interval (default: theirs)",
    )
    engine_threads: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="OMP_NUM_THREADS of each engine (default: engine_threads(replicas), the "
        "physical cores shared among the replicas, less one each)",
        json_schema_extra={"flag": False},
    )

    @model_validator(mode="after")
    def _schedule_fits(self) -> StackConfig:
        if self.schedule is not None:
            if self.method == "off":
                raise ValueError("a k schedule needs speculative decoding: --method is off")
            fits(self.schedule, self.num_speculative_tokens)
        return self

    @property
    def speculative(self) -> SpeculativeSetting:
        """What the engine speculates with (k 0 when the method is off)."""
        k = 0 if self.method == "off" else self.num_speculative_tokens
        return SpeculativeSetting(k, self.method, self.schedule)

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


def state_path(state_dir: Path) -> Path:
    return state_dir / "state.json"


def load_state(state_dir: Path) -> StackState | None:
    path = state_path(state_dir)
    if not path.is_file():
        return None
    try:
        return StackState.model_validate_json(path.read_text())
    except (ValueError, OSError) as err:
        raise UserError(
            f"{path} is not a local-stack state file ({str(err).splitlines()[0]}); check that "
            f"nothing of an old stack still runs (ps -ef), then remove it: rm {path}"
        ) from None


def save_state(state: StackState) -> None:
    """state.json replaced atomically (a reader sees the old file or the new one, never a part;
    a crash keeps one of them): written beside it, flushed to disk, renamed over it."""
    path = state_path(state.config.state_dir)
    partial = path.with_name(f".{path.name}.partial")
    with partial.open("w", encoding="utf-8") as file:
        file.write(state.model_dump_json(indent=2))
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path)


def baseline_path(config: StackConfig) -> Path:
    """Where `up` writes the baseline the sidecars read (taken from config.baseline)."""
    return config.state_dir / "baseline.yaml"
