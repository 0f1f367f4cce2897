"""The processes of the local stack as `Component`s (how each is started and where it listens):
engines, sidecars, the router, the doors and Prometheus with its configuration and rules."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from dflash_ops.local import door, keys
from dflash_ops.local.engine import engine_argv, engine_env
from dflash_ops.local.keys import CURRENT_KEY, NEXT_KEY, ROUTER_KEY
from dflash_ops.local.router import PROCESS_TITLE, keyed_router_argv, router_argv
from dflash_ops.local.stack_config import StackConfig, baseline_path
from dflash_ops.local.supervisor import (
    say,
)
from dflash_ops.paths import RULES_DIR

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
                *(
                    ["--scrape-interval", f"{config.sidecar_scrape_interval:g}"]
                    if config.sidecar_scrape_interval is not None
                    else []
                ),
                # The schedule in force, which the schedule recommendation compares with.
                *(
                    ["--speculative-schedule", json.dumps([list(r) for r in config.schedule])]
                    if config.schedule is not None
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
