"""The local stack's process handling with stand-in processes (the real engine: tests/e2e)."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest
from dflash_ops.errors import UserError
from dflash_ops.local import stack, supervisor
from dflash_ops.loopback import free_port


def config(tmp_path: Path, **overrides: object) -> stack.StackConfig:
    values: dict[str, object] = {"state_dir": tmp_path, "prometheus": False}
    values.update(overrides)
    return stack.StackConfig.model_validate(values)


def spawn_family(cfg: stack.StackConfig, name: str = "engine") -> supervisor.ProcessRecord:
    """A component whose leader starts two children, like vLLM's API server and engine core."""
    argv = [sys.executable, "-c", "import subprocess, time; "
            "[subprocess.Popen(['sleep', '300']) for _ in range(2)]; time.sleep(300)"]  # fmt: skip
    record = supervisor.spawn(name, argv, "http://127.0.0.1:1", cfg.state_dir / f"{name}.log")
    deadline = time.monotonic() + 10
    while len(supervisor.group_members(record)) < 3:
        assert time.monotonic() < deadline, "children did not start"
        time.sleep(0.05)
    return record


def test_down_stops_what_outlives_a_killed_leader(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    record = spawn_family(cfg)
    stack._save_state(stack.StackState(config=cfg, processes=[record]))
    os.kill(record.pid, signal.SIGKILL)  # the API server dies; its engine core and worker stay
    deadline = time.monotonic() + 5
    while supervisor.alive(record):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    leftovers = supervisor.group_members(record)
    assert len(leftovers) == 2
    row = stack.status(tmp_path)[0]
    assert not row["running"] and row["leftover_processes"] == leftovers
    assert stack.down(tmp_path) == ["engine"]
    assert supervisor.group_members(record) == []
    assert not (tmp_path / "state.json").exists()


def test_up_refuses_another_configuration_while_running(tmp_path: Path) -> None:
    cfg = config(tmp_path, num_speculative_tokens=4)
    record = spawn_family(cfg)
    stack._save_state(stack.StackState(config=cfg, processes=[record]))
    try:
        with pytest.raises(UserError, match="another configuration is running"):
            stack.up(config(tmp_path, num_speculative_tokens=7))
    finally:
        stack.down(tmp_path, quiet=True)


def test_a_stranger_on_the_engine_port_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        port = stranger.getsockname()[1]
        with pytest.raises(UserError, match=f"port {port} \\(engine\\) is in use.*--engine-port"):
            stack.up(config(tmp_path, engine_port=port))
    assert not (tmp_path / "models").exists()  # nothing built, nothing spawned


def test_a_corrupt_state_file_is_reported_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text("{ not json")
    for action in (stack.status, stack.down, lambda d: stack.up(config(d))):
        with pytest.raises(UserError, match="is not a local-stack state file"):
            action(tmp_path)


def test_the_draft_path_never_names_another_speculative_method(tmp_path: Path) -> None:
    """vLLM rewrites method draft_model to dflash when the draft's path contains "dflash" (a
    checkout named dflash-serve): the engine gets the draft relative to the models directory.
    tests/e2e runs the real engine from a state directory named that way."""
    import json

    config = stack.StackConfig(state_dir=tmp_path / "dflash-serve" / "eagle3-dspark")
    argv = stack.engine_argv(config)
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["method"] == "draft_model"
    assert not any(word in spec["model"].lower() for word in ("eagle", "dflash", "dspark"))
    assert (config.models_dir / spec["model"]).resolve() == config.draft_dir.resolve()


def test_too_little_shared_memory_names_the_container_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil as shutil_module
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(
        shutil_module, "disk_usage", lambda path: usage(64 << 20, 2 << 20, 62 << 20)
    )
    ports = [free_port() for _ in range(3)]
    cfg = config(tmp_path, engine_port=ports[0], sidecar_port=ports[1], prometheus_port=ports[2])
    with pytest.raises(UserError, match=r"/dev/shm has 62 MiB free.*--shm-size=1g"):
        stack.up(cfg)
    assert not (cfg.state_dir / "engine.log").exists()  # refused before anything started
