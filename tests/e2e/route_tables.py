"""Every route a client could try, read from the route tables of what stands behind the door.

- vLLM: `build_app()` of the given Python environment (vLLM 0.33.0's in .venv-vllm033, the CPU
  engine's in .venv), for generation and for every task vLLM knows, with and without
  `--enable-scale-out` (which adds /inference/v1/* and the render endpoints): FastAPI's own
  `app.routes`, each with its methods.
- vllm-router: its routes are compiled into the Rust extension (axum) with no table to ask, so
  they are read from the binary's strings: every run of path characters starting with `/v1/` or
  with a known admin word is split at each `/` into every contiguous run of segments. That is a
  superset of the real routes (extra paths only make the probe stricter), and a test checks
  that the admin routes the issue names are among them.

vLLM's tables are kept in .cache/route-tables, keyed by this file and by the name, size and
modification time of every file of the environment's vllm package: building them imports vLLM
and its app four times (10 s per environment idle, half a minute with both cores busy), and an
environment's tables change only when its vLLM or this file does.

    python -m tests.e2e.route_tables   # prints vLLM's table of this environment as JSON
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# A {param} of a route: any value reaches the same handler.
PARAM = re.compile(r"\{[^}/]+\}")


def _vllm_table() -> dict[str, list[str]]:
    import typing

    import vllm.tasks as tasks
    from vllm.entrypoints.launchers.app import build_app
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:  # vLLM 0.32 (the CPU engine)
        from vllm.entrypoints.launchers.cli_args import make_arg_parser  # type: ignore

    # Literal[Literal[...], ...] flattens to the strings.
    every_task = typing.get_args(tasks.SupportedTask)
    seen: dict[str, set[str]] = {}
    for extra in ([], ["--enable-scale-out"]):
        for supported in (("generate",), every_task):
            args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "x", *extra])
            app = build_app(args, supported_tasks=supported)
            for route in app.routes:
                for method in getattr(route, "methods", None) or {"GET"}:
                    seen.setdefault(route.path, set()).add(method)
    return {path: sorted(methods) for path, methods in sorted(seen.items())}


CACHE = REPO / ".cache" / "route-tables"


def cache_key(python: Path) -> str | None:
    """What the tables of `python`'s environment depend on: this file and every file of its vllm
    package (name, size, modification time); None where the package is not found."""
    packages = sorted(python.parent.parent.glob("lib/python*/site-packages/vllm"))
    if not packages:
        return None
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(str(python).encode())
    for root, dirs, files in os.walk(packages[-1]):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            stat = os.stat(os.path.join(root, name))
            digest.update(f"{root}/{name} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:32]


@functools.cache
def vllm_routes(python: Path, cache: Path = CACHE) -> dict[str, list[str]]:
    """vLLM's routes (path -> methods) as the vLLM of `python`'s environment registers them
    (built once per environment and vLLM install: see the module doc)."""
    key = cache_key(python)
    kept = cache / f"{key}.json"
    if key is not None and kept.is_file():
        table: dict[str, list[str]] = json.loads(kept.read_text())
        return table
    table = build_vllm_routes(python)
    if key is not None:
        cache.mkdir(parents=True, exist_ok=True)
        partial = kept.with_suffix(f".{os.getpid()}.tmp")  # two workers may write at once
        partial.write_text(json.dumps(table))
        partial.replace(kept)
    return table


def build_vllm_routes(python: Path) -> dict[str, list[str]]:
    """vLLM's routes, read from the app `python`'s vLLM builds (in a subprocess: seconds)."""
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [str(python), "-m", "tests.e2e.route_tables"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    table: dict[str, list[str]] = json.loads(done.stdout.strip().splitlines()[-1])
    return table


ROUTER_WORDS = (
    "add_worker", "remove_worker", "list_workers", "flush_cache", "get_loads", "get_model_info",
    "get_server_info", "workers", "scheduling", "diagnostics", "finish_session", "health",
    "health_generate", "liveness", "readiness", "generate", "v1",
)  # fmt: skip


def router_routes(extension: Path) -> set[str]:
    """Candidate routes of vllm-router from its compiled extension (see the module doc)."""
    text = extension.read_bytes().decode("latin-1")
    runs = re.findall(r"(?:/[A-Za-z0-9_{}.*:-]+)+", text)
    found: set[str] = set()
    for run in runs:
        segments = [s for s in run.split("/") if s]
        if not segments or not any(s in ROUTER_WORDS or s.startswith("{") for s in segments):
            continue
        if any(len(s) > 40 for s in segments):
            continue
        for start in range(len(segments)):
            for end in range(start + 1, min(len(segments), start + 5) + 1):
                found.add("/" + "/".join(segments[start:end]))
    return {p for p in found if any(w in p.split("/") for w in ROUTER_WORDS)}


def concrete(path: str) -> str:
    """A request path for a route: each {param} filled in ({path:path} with two segments)."""
    return PARAM.sub(lambda m: "a/b" if m.group(0).endswith(":path}") else "probe", path)


if __name__ == "__main__":
    print(json.dumps(_vllm_table()))
    sys.exit(0)
