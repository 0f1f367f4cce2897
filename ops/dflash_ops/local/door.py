"""The door: nginx in front of vLLM or vLLM's router, checking the API key and the path allow-list.

One nginx.conf and door.js (charts/dflash-serve/files/door/) serve the chart and the local stack;
what differs between deployments is the small door.d/ directory this module writes (the chart's
templates/door.yaml renders the same files from its values; a test holds the two to the same
text). The paths the door opens without a key, and the ones it never opens, are in
files/door/paths.yaml; the keyed paths are the chart's door.keyedPaths (+ extraKeyedPaths).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from dflash_ops.paths import CHART_DIR, CHART_FILES_DIR

DOOR_FILES_DIR = CHART_FILES_DIR / "door"
NGINX_CONF = DOOR_FILES_DIR / "nginx.conf"
DOOR_JS = DOOR_FILES_DIR / "door.js"
# The door's module, where nginx packages put it (Debian's libnginx-mod-http-js, the official
# nginx image's nginx-module-njs).
NJS_MODULE = Path("/usr/lib/nginx/modules/ngx_http_js_module.so")

DoorRole = Literal["engine", "router"]


@cache
def door_paths() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DOOR_FILES_DIR / "paths.yaml").read_text())
    return loaded


@cache
def _chart_defaults() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    return loaded


def default_keyed_paths() -> tuple[str, ...]:
    """The chart's door.keyedPaths: what clients may call with a key."""
    return tuple(_chart_defaults()["door"]["keyedPaths"])


def default_shutdown_timeout() -> int:
    """The chart's drain budget with its default termination.* (templates/_engine.tpl)."""
    termination = _chart_defaults()["termination"]
    return int(termination["gracePeriodSeconds"]) - int(termination["preStopSeconds"]) - 10


def map_source(path: str) -> str:
    """How routes.map matches a path: a case-sensitive regex of the whole path, a {name}
    segment standing for any one segment. (nginx matches a map's plain strings without regard
    to case: `/HEALTH` would reach what stands behind the door, which may not care either.)"""
    return "~^" + re.sub(r"\{[^/}]+\}", "[^/]+", path.replace(".", r"\.")) + "$"


class DoorConfig(BaseModel):
    model_config = ConfigDict(frozen=True)

    role: DoorRole
    listen: str = Field(description="host:port the door listens on")
    upstream_port: int = Field(ge=1, le=65535, description="loopback port of what it guards")
    keys_dir: str = Field(description="directory of the key files (a mounted Secret)")
    key_names: tuple[str, ...] = Field(description="files of keys_dir that hold keys; empty: none")
    keyed_paths: tuple[str, ...]
    # The engines' door also opens, with a key, the render endpoints vllm-router's cache_aware
    # tokenizes through.
    router_render: bool = False
    timeout_s: int = Field(ge=1, description="proxy read/send timeout (a stream's idle time)")
    shutdown_timeout_s: int = Field(ge=1, description="how long a graceful stop waits")
    # nginx started as root runs its workers as `nobody`, who cannot read keys only their owner
    # may; the local stack names its own user. The chart's pods run as uid 1000: no switch.
    worker_user: str | None = None

    def routes(self) -> list[tuple[str, str]]:
        paths = door_paths()
        routes = [(p, "open") for p in paths["open"][self.role]]
        keyed = list(self.keyed_paths)
        if self.role == "engine" and self.router_render:
            keyed += [p for p in paths["routerRender"] if p not in keyed]
        return routes + [(p, "keyed") for p in keyed]

    def files(self) -> dict[str, str]:
        """door.d/'s files by name."""
        routes = "".join(f"{map_source(path)} {kind};\n" for path, kind in self.routes())
        server = (
            f"listen {self.listen};\n"
            f'set $dflash_keys_dir "{self.keys_dir}";\n'
            f'set $dflash_key_names "{" ".join(self.key_names)}";\n'
            f"proxy_read_timeout {self.timeout_s}s;\n"
            f"proxy_send_timeout {self.timeout_s}s;\n"
        )
        return {
            "main.conf": f"worker_shutdown_timeout {self.shutdown_timeout_s}s;\n"
            + (f"user {self.worker_user};\n" if self.worker_user else ""),
            "upstream.conf": f"server 127.0.0.1:{self.upstream_port};\n",
            "server.conf": server,
            "routes.map": routes,
        }


def write_conf(config: DoorConfig, conf_dir: Path) -> Path:
    """nginx.conf, door.js and door.d/ in conf_dir; returns the nginx.conf to start with."""
    (conf_dir / "door.d").mkdir(parents=True, exist_ok=True)
    for name, text in config.files().items():
        (conf_dir / "door.d" / name).write_text(text)
    (conf_dir / "nginx.conf").write_text(NGINX_CONF.read_text())
    (conf_dir / "door.js").write_text(DOOR_JS.read_text())
    return conf_dir / "nginx.conf"


def nginx_argv(nginx: str, prefix: Path, conf: Path, signal: str | None = None) -> list[str]:
    """The door's command line: prefix (pid, temp files) must be writable, conf may not be."""
    argv = [nginx, "-p", f"{prefix}/", "-c", str(conf), "-e", "stderr"]
    return argv + (["-s", signal] if signal else [])
