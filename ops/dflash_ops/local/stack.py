"""`dflash-serve local up|down|status`: a real vLLM CPU engine, the sidecar and Prometheus; with
`--replicas N`, N engines (a sidecar each) behind vLLM's router on the main engine port. This
module starts, restarts, stops and reports the stack; what it starts is in `components` (and
`engine`), its configuration and state in `stack_config` (their names are also here).

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
import threading
import time
import urllib.error
import urllib.request
from functools import partial
from pathlib import Path

import yaml

from dflash_ops import directory_lock
from dflash_ops.errors import UserError
from dflash_ops.local import door, keys, known_stacks
from dflash_ops.local.components import (
    Component as Component,
)
from dflash_ops.local.components import (
    _components as _components,
)
from dflash_ops.local.components import (
    prometheus_config as prometheus_config,
)
from dflash_ops.local.engine import (
    ENGINE_SHM_BYTES as ENGINE_SHM_BYTES,
)
from dflash_ops.local.engine import (
    _check_engine_installed as _check_engine_installed,
)
from dflash_ops.local.engine import (
    _check_shared_memory as _check_shared_memory,
)
from dflash_ops.local.engine import engine_argv as engine_argv
from dflash_ops.local.engine import engine_env as engine_env
from dflash_ops.local.engine import engine_threads as engine_threads
from dflash_ops.local.engine import ensure_models as ensure_models
from dflash_ops.local.engine import shared_memory_needed as shared_memory_needed
from dflash_ops.local.keys import CURRENT_KEY, NEXT_KEY, ROUTER_KEY
from dflash_ops.local.stack_config import READY_PATHS as READY_PATHS
from dflash_ops.local.stack_config import SERVED_MODEL as SERVED_MODEL
from dflash_ops.local.stack_config import StackConfig as StackConfig
from dflash_ops.local.stack_config import StackState as StackState
from dflash_ops.local.stack_config import baseline_path as baseline_path
from dflash_ops.local.stack_config import kind_of as kind_of
from dflash_ops.local.stack_config import load_state as load_state
from dflash_ops.local.stack_config import save_state as _save_state
from dflash_ops.local.stack_config import state_path as _state_path
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
    """Rotate the running stack's API key in two steps, as the docs' "Rotating the API key" does
    with the chart's Secret: with a new key, the doors accept it beside the current one; with
    None (`--finish`), the new key becomes the only one. No process restarts."""
    with directory_lock.holding(state_dir, "rotate the key"):
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
    directory (directory_lock): a second is refused, naming the first."""
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
    with directory_lock.holding(config.state_dir, "start the stack"):
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
    with directory_lock.holding(state_dir, "stop the stack"):
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
    recorded: set[int] = set()  # every process the records account for
    for record in state.processes if state else []:
        probe = READY_PATHS[kind_of(record.name)]
        running = alive(record)
        members = group_members(record)
        recorded.update(members)
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
