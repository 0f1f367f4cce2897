"""The local stack's process handling with stand-in processes (the real engine: tests/e2e)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dflash_ops.errors import UserError
from dflash_ops.local import engine, stack, supervisor
from dflash_ops.loopback import free_port, free_ports_in_a_row


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


def test_a_stranger_on_the_router_metrics_port_is_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        port = stranger.getsockname()[1]
        cfg = config(
            tmp_path, replicas=2, engine_port=free_port(), replica_base_port=free_ports_in_a_row(2),
            sidecar_port=free_ports_in_a_row(2), router_metrics_port=port,
        )  # fmt: skip
        with pytest.raises(UserError, match=f"port {port} \\(router metrics\\).*--router-metrics"):
            stack.up(cfg)
    assert not (tmp_path / "models").exists()


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


def test_the_engine_skips_vllms_aot_compile_cache_unless_the_caller_chose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CPU engine's vLLM cannot load its AOT compile cache back (stack.engine_env); the
    real engine's log is tests/e2e/test_local_stack.py's."""
    config = stack.StackConfig(state_dir=tmp_path, kv_cache_gib=3)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    assert stack.engine_env(config) == {
        "VLLM_CPU_KVCACHE_SPACE": "3", "VLLM_USE_AOT_COMPILE": "0"
    }  # fmt: skip
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    assert stack.engine_env(config) == {"VLLM_CPU_KVCACHE_SPACE": "3"}  # the caller's stays


def test_the_engine_core_runs_the_model_on_its_share_of_the_cores_unless_the_caller_chose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's uniprocess executor (no worker process spinning beside the engine core), its
    threads the replicas' share of the physical cores (stack.engine_env says what it saves)."""
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(engine, "engine_threads", lambda engines: 12 // engines)
    one, three = (stack.StackConfig(state_dir=tmp_path, replicas=n) for n in (1, 3))
    assert stack.engine_env(one) == {
        "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "OMP_NUM_THREADS": "12",
    }  # fmt: skip
    assert stack.engine_env(three)["OMP_NUM_THREADS"] == "4"
    pinned = stack.StackConfig(state_dir=tmp_path, replicas=3, engine_threads=2)
    assert stack.engine_env(pinned)["OMP_NUM_THREADS"] == "2"
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # the caller's threads stay
    assert stack.engine_env(one) == {
        "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"
    }  # fmt: skip
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # vLLM's own worker process
    assert stack.engine_env(one) == {"VLLM_CPU_KVCACHE_SPACE": "1"}


def fake_cpus(root: Path, cores: list[tuple[int, int]]) -> Path:
    """A /sys/devices/system/cpu with one (package, core) per logical CPU."""
    for cpu, (package, core) in enumerate(cores):
        topology = root / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(f"{package}\n")
        (topology / "core_id").write_text(f"{core}\n")
    return root


@pytest.mark.parametrize(
    ("cores", "engines", "threads"),
    [
        ([(0, 0), (0, 1)], 1, 1),  # this machine: 2 cores, one left to the API server
        ([(0, 0), (0, 1)], 2, 1),  # never fewer than one
        ([(0, c) for c in range(8)] * 2, 1, 7),  # 16 logical CPUs, 8 cores (SMT): per core
        ([(p, c) for p in (0, 1) for c in range(8)], 2, 7),  # two sockets of 8 cores
        ([(0, c) for c in range(16)], 3, 4),
    ],
)
def test_engine_threads_share_the_physical_cores(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cores: list[tuple[int, int]],
    engines: int,
    threads: int,
) -> None:
    root = fake_cpus(tmp_path / "cpu", cores)
    monkeypatch.setattr(stack.os, "sched_getaffinity", lambda pid: set(range(len(cores))))
    assert stack.engine_threads(engines, root) == threads


def test_engine_threads_count_only_the_cpus_this_process_may_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = fake_cpus(tmp_path / "cpu", [(0, c) for c in range(8)])
    monkeypatch.setattr(stack.os, "sched_getaffinity", lambda pid: {0, 1, 2})  # taskset 0-2
    assert stack.engine_threads(1, root) == 2
    (root / "cpu1" / "topology" / "core_id").unlink()  # unreadable: counted as a core of its own
    assert stack.engine_threads(1, root) == 2


def test_too_little_shared_memory_names_the_container_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil as shutil_module
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(
        shutil_module, "disk_usage", lambda path: usage(64 << 20, 2 << 20, 62 << 20)
    )
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # vLLM's worker and its ring
    ports = [free_port() for _ in range(3)]
    cfg = config(tmp_path, engine_port=ports[0], sidecar_port=ports[1], prometheus_port=ports[2])
    with pytest.raises(UserError, match=r"/dev/shm has 62 MiB free.*--shm-size=1g"):
        stack.up(cfg)
    assert not (cfg.state_dir / "engine.log").exists()  # refused before anything started


@pytest.mark.parametrize(
    ("caller", "needed"),
    [
        ({}, 0),  # the stack's own layout: the engine core runs the model, no ring
        ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, 0),
        ({"VLLM_ENABLE_V1_MULTIPROCESSING": " 0"}, 0),
        ({"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}, 3 * stack.ENGINE_SHM_BYTES),
        ({"VLLM_ENABLE_V1_MULTIPROCESSING": ""}, 3 * stack.ENGINE_SHM_BYTES),  # not 0: checked
    ],
)
def test_shared_memory_is_needed_only_for_vllms_worker_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caller: dict[str, str], needed: int
) -> None:
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    for name, value in caller.items():
        monkeypatch.setenv(name, value)
    assert stack.shared_memory_needed(config(tmp_path, replicas=3)) == needed


def stranger_group() -> tuple[int, list[int]]:
    """A process group that is none of ours: a leader with a child, in a session of its own."""
    import subprocess

    leader = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, time; subprocess.Popen(['sleep', '120']); "
         "time.sleep(120)"],
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while True:
        members = [
            int(p.name)
            for p in Path("/proc").iterdir()
            if p.name.isdigit()
            and (fields := supervisor._stat_fields(p.name)) is not None
            and fields[2] == str(leader.pid)
        ]
        if len(members) == 2:
            return leader.pid, members
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.mark.parametrize("recorded", ["same-command", "old-record-without-marker"])
def test_a_stale_state_file_never_signals_a_strangers_group(tmp_path: Path, recorded: str) -> None:
    """The recorded pid now leads another process group (pid reuse): `local down` and `local up`
    must leave it alone."""
    pid, members = stranger_group()
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    cfg = config(tmp_path)
    record = supervisor.ProcessRecord(
        name="engine",
        pid=pid,
        url="http://127.0.0.1:1",
        log=str(tmp_path / "engine.log"),
        # The worst case: the stranger even runs the recorded command line.
        argv=argv if recorded == "same-command" else ["vllm", "serve"],
        marker="engine-0123" if recorded == "same-command" else "",
        start_time=None,
    )
    stack._save_state(stack.StackState(config=cfg, processes=[record]))
    try:
        assert supervisor.group_members(record) == []
        stack.down(tmp_path, quiet=True)
        for member in members:
            assert Path(f"/proc/{member}").exists(), "a stranger's process was killed"
    finally:
        for member in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(member, signal.SIGKILL)


def test_a_reused_pid_with_the_same_command_is_not_alive(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    record = spawn_family(cfg)
    try:
        assert supervisor.alive(record)
        assert not supervisor.alive(record.model_copy(update={"start_time": record.start_time + 1}))
    finally:
        supervisor.stop_process(record, grace_s=2)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_during_up_stops_what_was_started(tmp_path: Path, sig: int) -> None:
    """`local up` interrupted by Ctrl-C, its terminal or a container stop while the engine loads
    leaves no orphan and exits as a shell reports the signal (128 + its number: 130 for Ctrl-C),
    with one line and no traceback."""
    import subprocess

    script = tmp_path / "up.py"
    script.write_text(
        "import sys, time\n"
        "from dflash_ops.local import engine, stack, supervisor\n"
        "def slow_start(config, state, started):\n"
        "    record = supervisor.spawn('engine', ['sleep', '300'], 'http://127.0.0.1:1',\n"
        "                              config.state_dir / 'engine.log')\n"
        "    started.append(record)\n"
        "    stack._save_state(stack.StackState(config=config, processes=[record]))\n"
        "    print(record.pid, flush=True)\n"
        "    time.sleep(300)\n"
        "stack._start = slow_start\n"
        "from dflash_ops.cli import main\n"
        f"sys.exit(main(['local', 'up', '--state-dir', {str(tmp_path)!r}, '--no-prometheus',\n"
        f"               '--engine-port', '{free_port()}', '--sidecar-port', '{free_port()}']))\n"
    )
    process = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    engine_pid = int(process.stdout.readline())
    process.send_signal(sig)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + sig, err
    assert "stopping what this command started" in err and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (
        "dflash-serve local: error: interrupted; nothing of the stack is left running"
    ), err
    deadline = time.monotonic() + 10
    while (
        Path(f"/proc/{engine_pid}").exists()
        and (supervisor._stat_fields(engine_pid) or ["Z"])[0] != "Z"
    ):
        assert time.monotonic() < deadline, "the engine was left running"
        time.sleep(0.1)


def test_an_interrupted_up_gives_back_every_signal_handler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """up() ignores Ctrl-C while it stops what it started; it must hand SIGINT back as it found
    it (with SIGTERM and SIGHUP). Left ignored, a caller that goes on (a sweep, this test
    session's worker) loses its Ctrl-C, and so does every process it starts afterwards: an
    ignored signal stays ignored across exec (the Ctrl-C test above then hung in CI)."""

    def interrupted_start(
        config: stack.StackConfig, previous: object, started: object
    ) -> stack.StackState:
        raise KeyboardInterrupt

    monkeypatch.setattr(stack, "_start", interrupted_start)
    sentinel = {
        sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    }
    with pytest.raises(stack.StackInterrupted):
        stack.up(config(tmp_path, engine_port=free_port(), sidecar_port=free_port()))
    assert {sig: signal.getsignal(sig) for sig in sentinel} == sentinel


def test_a_caller_that_exits_keeps_the_signals_ignored_after_an_interruption(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI exits after an interruption: a second Ctrl-C landing after the clean-up, while
    the interpreter shuts down, must not end it by a traceback in an atexit handler."""

    def interrupted_start(
        config: stack.StackConfig, previous: object, started: object
    ) -> stack.StackState:
        raise KeyboardInterrupt

    monkeypatch.setattr(stack, "_start", interrupted_start)
    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = {sig: signal.getsignal(sig) for sig in handled}
    try:
        with pytest.raises(stack.StackInterrupted):
            stack.up(
                config(tmp_path, engine_port=free_port(), sidecar_port=free_port()),
                exits_when_interrupted=True,
            )
        assert {sig: signal.getsignal(sig) for sig in handled} == dict.fromkeys(
            handled, signal.SIG_IGN
        )
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


@pytest.mark.parametrize(
    ("host", "message"),
    [
        ("abc.invalid", "not an address or a name"),
        ("999.999.1.1", "not an address or a name"),
        ("192.0.2.1", "must be an address of this machine"),
    ],
)
def test_a_bad_host_is_named_as_such_not_as_a_port_in_use(
    tmp_path: Path, host: str, message: str
) -> None:
    with pytest.raises(UserError, match=message):
        stack.up(config(tmp_path, host=host, engine_port=free_port()))


# -- replicas behind vLLM's router ----------------------------------------------------------


def test_a_router_that_renames_itself_is_still_known_and_stopped(tmp_path: Path) -> None:
    """vllm-router calls setproctitle: /proc then shows `vllm::router` and none of the
    environment the marker lives in. status must still see it, and down must stop it."""
    pytest.importorskip("vllm_router", reason="the router extra (vllm-router) is not installed")
    from dflash_ops.local.router import PROCESS_TITLE, router_argv

    cfg = config(tmp_path)
    port = free_port()
    record = supervisor.spawn(
        "router",
        router_argv([], "round_robin", port, free_port()),
        f"http://127.0.0.1:{port}",
        tmp_path / "router.log",
        title=PROCESS_TITLE,
    )
    stack._save_state(stack.StackState(config=cfg, processes=[record]))
    try:
        deadline = time.monotonic() + 30
        while not supervisor.http_ok(f"{record.url}/liveness"):
            assert time.monotonic() < deadline, (tmp_path / "router.log").read_text()[-2000:]
            time.sleep(0.2)
        cmdline = Path(f"/proc/{record.pid}/cmdline").read_bytes().split(b"\0")[0]
        assert cmdline == PROCESS_TITLE.encode()  # it did rename itself
        assert supervisor.alive(record)
        assert supervisor.group_members(record) == [record.pid]
        (row,) = stack.status(tmp_path)
        assert row["running"] is True
        assert stack.down(tmp_path) == ["router"]
        assert not Path(f"/proc/{record.pid}").exists() or not supervisor.alive(record)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record.pid, signal.SIGKILL)


def test_replicas_get_their_own_ports_and_the_router_the_main_one(tmp_path: Path) -> None:
    cfg = config(tmp_path, replicas=3, prometheus=True)
    components = {c.name: c for c in stack._components(cfg)}
    assert [n for n in components if n != "prometheus"] == [
        "engine-0", "engine-1", "engine-2", "sidecar-0", "sidecar-1", "sidecar-2", "router",
    ]  # fmt: skip
    assert [components[f"engine-{i}"].port for i in range(3)] == [8100, 8101, 8102]
    assert [components[f"sidecar-{i}"].port for i in range(3)] == [9100, 9101, 9102]
    router = components["router"]
    assert router.port == 8000
    workers = router.argv[router.argv.index("--worker-urls") + 1 : router.argv.index("--policy")]
    assert workers == [f"http://127.0.0.1:{p}" for p in (8100, 8101, 8102)]
    # Each sidecar watches its own engine.
    for i in range(3):
        argv = components[f"sidecar-{i}"].argv
        assert argv[argv.index("--engine-url") + 1] == f"http://127.0.0.1:{8100 + i}"
    # cache_aware tokenizes through the engines' render endpoints; other policies need none.
    assert all("--enable-scale-out" in components[f"engine-{i}"].argv for i in range(3))
    plain = stack._components(config(tmp_path, replicas=2, router_policy="round_robin"))
    assert not any("--enable-scale-out" in c.argv for c in plain if c.name.startswith("engine"))
    # One replica: the names and ports of before, no router.
    single = [c.name for c in stack._components(config(tmp_path))]
    assert single == ["engine", "sidecar"]


def test_prometheus_scrapes_every_replica_and_the_router(tmp_path: Path) -> None:
    import yaml

    cfg = config(tmp_path, replicas=2, prometheus=True)
    scrape = yaml.safe_load(stack.prometheus_config(cfg).read_text())["scrape_configs"]
    jobs = {job["job_name"]: job["static_configs"] for job in scrape}
    assert [s["targets"] for s in jobs["vllm"]] == [["127.0.0.1:8100"], ["127.0.0.1:8101"]]
    assert [s["labels"]["pod"] for s in jobs["vllm"]] == ["local-0", "local-1"]
    assert [s["targets"] for s in jobs["dflash-sidecar"]] == [
        ["127.0.0.1:9100"],
        ["127.0.0.1:9101"],
    ]
    assert jobs["vllm-router"][0]["targets"] == ["127.0.0.1:29000"]


def test_prometheus_runs_the_rules_files_at_its_own_interval(tmp_path: Path) -> None:
    """The local Prometheus evaluates every group, the recording group included (30 s in the
    file, the chart's), at its 5 s; every expression as the file has it, and promtool reads
    the configuration and the rules it points at."""
    import subprocess

    import yaml
    from dflash_ops.paths import RULES_DIR

    from tests.conftest import find_tool

    path = stack.prometheus_config(config(tmp_path, prometheus=True))
    prometheus = yaml.safe_load(path.read_text())
    assert prometheus["global"]["evaluation_interval"] == "5s"
    [pattern] = prometheus["rule_files"]
    copies = sorted(Path(pattern).parent.glob(Path(pattern).name))
    sources = sorted(RULES_DIR.glob("*.yaml"))
    assert [c.name for c in copies] == [s.name for s in sources] and sources
    for copy, source in zip(copies, sources, strict=True):
        ran, file = yaml.safe_load(copy.read_text()), yaml.safe_load(source.read_text())
        assert {g["interval"] for g in ran["groups"]} == {"5s"}
        assert "30s" in {g.get("interval") for g in file["groups"]}  # what this test is about
        for group in file["groups"]:
            group["interval"] = "5s"
        assert ran == file
    checked = subprocess.run(
        [find_tool("promtool"), "check", "config", str(path)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 1 rule files found" in checked.stdout, checked.stdout


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"replicas": 2, "replica_base_port": 9099}, "--sidecar-port and --replica-base-port"),
        ({"replicas": 2, "router_metrics_port": 9090, "prometheus": True}, "--prometheus-port"),
        ({"replicas": 2, "engine_port": 8101}, "--replica-base-port and --engine-port"),
        ({"replicas": 2, "kv_events_port": 5557}, "kv_events_port serves one engine"),
    ],
)
def test_ports_asked_for_twice_are_named(
    tmp_path: Path, overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        config(tmp_path, **overrides)


def test_each_pair_has_its_own_models_served_name_and_dtype(tmp_path: Path) -> None:
    import json

    tiny = stack.StackConfig(state_dir=tmp_path)
    paying = stack.StackConfig(state_dir=tmp_path, models="paying", num_speculative_tokens=3)
    assert len({tiny.target_dir, tiny.draft_dir, paying.target_dir, paying.draft_dir}) == 4
    for config, name, dtype in ((tiny, "tiny", "float32"), (paying, "paying", "bfloat16")):
        argv = stack.engine_argv(config)
        assert argv[argv.index("--served-model-name") + 1] == name
        assert argv[argv.index("--dtype") + 1] == dtype
        assert argv[argv.index("--model") + 1] == str(config.target_dir.resolve())
        spec = json.loads(argv[argv.index("--speculative-config") + 1])
        assert (config.models_dir / spec["model"]).resolve() == config.draft_dir.resolve()
    # The paying draft is the target's first layers; with a noise, those plus noise, apart.
    noisy = stack.StackConfig(state_dir=tmp_path, models="paying", draft_noise=10)
    assert paying.draft_dir == paying.paying_draft_dir and paying.noise == 0
    assert noisy.draft_dir == paying.models_dir / "paying-draft-noise10" and noisy.noise == 10
    assert tiny.noise == 0.05 and tiny.draft_dir.name == "draft-noise0.05"


def test_replica_engines_start_together_and_the_rest_once_they_are_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engines are spawned one after another without waiting (each start is its own imports,
    load and compile); the sidecars and the router start one by one once every engine is ready;
    a failed wait stops everything spawned."""
    events: list[str] = []
    spawned: list[supervisor.ProcessRecord] = []
    spawned_at: dict[str, float] = {}

    def fake_spawn(
        name: str, argv: list[str], url: str, log: Path, **_: object
    ) -> supervisor.ProcessRecord:
        events.append(f"spawn {name}")
        spawned_at[name] = time.monotonic()
        record = supervisor.spawn(name, ["sleep", "300"], url, log)
        spawned.append(record)
        return record

    def fake_wait(
        record: supervisor.ProcessRecord, ready: object, timeout: float, what: str, started: float
    ) -> None:
        # Its timeout and the time it reports count from its spawn, not from this wait.
        assert began <= started <= spawned_at[record.name]
        events.append(f"ready {record.name}")
        if record.name == fail_at:
            raise UserError(f"{record.name} not ready")

    for name in ("_check_engine_installed", "_check_shared_memory", "ensure_models"):
        monkeypatch.setattr(stack, name, lambda *a, **k: None)
    monkeypatch.setattr(stack, "check_port_free", lambda *a, **k: None)
    monkeypatch.setattr(stack, "spawn", fake_spawn)
    monkeypatch.setattr(stack, "wait_ready", fake_wait)
    fail_at = None
    began = time.monotonic()
    cfg = config(tmp_path, replicas=3)
    state = stack._start(cfg, None, [])
    try:
        assert events[:6] == [
            "spawn engine-0", "spawn engine-1", "spawn engine-2",
            "ready engine-0", "ready engine-1", "ready engine-2",
        ]  # fmt: skip
        assert events[6:] == [
            "spawn sidecar-0", "ready sidecar-0", "spawn sidecar-1", "ready sidecar-1",
            "spawn sidecar-2", "ready sidecar-2", "spawn router", "ready router",
        ]  # fmt: skip
        assert [p.name for p in state.processes] == [c.name for c in stack._components(cfg)]
    finally:
        stack.down(tmp_path, quiet=True)

    # An engine that never gets ready: everything spawned so far is stopped.
    events.clear()
    spawned.clear()
    fail_at = "engine-1"
    with pytest.raises(UserError, match="engine-1 not ready"):
        stack.up(cfg)
    assert events == [
        "spawn engine-0", "spawn engine-1", "spawn engine-2",
        "ready engine-0", "ready engine-1",
    ]  # fmt: skip
    assert len(spawned) == 3 and not any(supervisor.alive(r) for r in spawned)


@pytest.mark.parametrize("kind", ["dangling link", "file"])
def test_a_models_path_that_is_no_directory_is_one_line(tmp_path: Path, kind: str) -> None:
    """STATE/models left as a link to a removed directory (a test's shared models, a moved
    checkout) or as a file: named with the fix, not a FileExistsError traceback."""
    models = tmp_path / "models"
    if kind == "file":
        models.write_text("")
    else:
        models.symlink_to(tmp_path / "gone")
    with pytest.raises(UserError, match=r"models is not a directory.*remove it"):
        stack.up(config(tmp_path, engine_port=free_port(), sidecar_port=free_port()))
    assert not (tmp_path / "state.json").exists()


def fake_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every part a `sleep`, ready at once: the stack's bookkeeping without engines."""

    def fake_spawn(
        name: str, argv: list[str], url: str, log: Path, **_: object
    ) -> supervisor.ProcessRecord:
        return supervisor.spawn(name, ["sleep", "300"], url, log)

    for name in ("_check_engine_installed", "_check_shared_memory", "ensure_models"):
        monkeypatch.setattr(stack, name, lambda *a, **k: None)
    monkeypatch.setattr(stack, "check_port_free", lambda *a, **k: None)
    monkeypatch.setattr(stack, "spawn", fake_spawn)
    monkeypatch.setattr(stack, "wait_ready", lambda *a, **k: None)


def test_a_restart_interrupted_keeps_and_records_the_parts_it_found_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine died; `local up` restarts it. In that window state.json lists the new engine
    and the sidecar it kept, `local down` from another command is refused (not a half-empty
    state deleted, the sidecar left listening), and a Ctrl-C stops only the engine it started:
    the sidecar runs on, recorded, and the message says so (it once stopped the whole stack,
    or said nothing was left while the sidecar ran)."""
    fake_parts(monkeypatch)
    cfg = config(tmp_path)
    first = stack.up(cfg)
    sidecar = next(p for p in first.processes if p.name == "sidecar")
    supervisor.stop_process(next(p for p in first.processes if p.name == "engine"))
    seen: dict[str, object] = {}

    def interrupted_wait(record: supervisor.ProcessRecord, *_: object) -> None:
        recorded = stack.load_state(tmp_path)
        seen["recorded"] = [p.name for p in recorded.processes] if recorded else []
        with pytest.raises(UserError, match=r"cannot stop the stack: `dflash-serve[^`]*` \(pid"):
            stack.down(tmp_path)
        seen["engine"] = record
        raise KeyboardInterrupt

    monkeypatch.setattr(stack, "wait_ready", interrupted_wait)
    try:
        with pytest.raises(stack.StackInterrupted) as stopped:
            stack.up(cfg)
        assert seen["recorded"] == ["engine", "sidecar"]
        assert "runs on: sidecar" in str(stopped.value) and stopped.value.left == ["sidecar"]
        assert supervisor.alive(sidecar)
        engine = seen["engine"]
        assert isinstance(engine, supervisor.ProcessRecord) and not supervisor.alive(engine)
        left = stack.load_state(tmp_path)
        assert left is not None and [p.pid for p in left.processes] == [sidecar.pid]
    finally:
        monkeypatch.setattr(stack, "wait_ready", lambda *a, **k: None)
        stack.down(tmp_path, quiet=True)
    assert not supervisor.alive(sidecar) and stack.load_state(tmp_path) is None


def test_a_second_command_on_a_state_directory_is_refused_naming_the_first(
    tmp_path: Path,
) -> None:
    """The lock is the kernel's: held by a command, refused to the next; gone with its holder,
    even by kill -9."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path; "
         "from dflash_ops import directory_lock; "
         "ctx = directory_lock.holding(Path(sys.argv[1]), 'start the stack'); ctx.__enter__(); "
         "print('held', flush=True); time.sleep(300)",
         str(tmp_path)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        done = subprocess.run(
            [sys.executable, "-m", "dflash_ops.cli", "local", "down", "--state-dir", str(tmp_path)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert f"(pid {holder.pid}) is working on {tmp_path}" in done.stderr
        assert "Traceback" not in done.stderr
    finally:
        holder.kill()
        holder.wait(timeout=10)
    assert stack.down(tmp_path, quiet=True) == []  # kill -9 left no lock behind


def test_state_json_is_never_seen_half_written(tmp_path: Path) -> None:
    """Readers while it is rewritten (as `local status` beside a starting stack) see the old
    file or the new one: it was written in place, and read empty."""
    import threading

    cfg = config(tmp_path)
    records = [
        supervisor.ProcessRecord(name=f"part-{i}", pid=10**6 + i, argv=["x" * (i * 50)],
                                 url="http://127.0.0.1:1", log=str(tmp_path / "log"))
        for i in range(40)
    ]  # fmt: skip
    errors: list[str] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            try:
                stack.load_state(tmp_path)
            except UserError as err:
                errors.append(str(err))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for n in range(400):
            stack._save_state(stack.StackState(config=cfg, processes=records[: n % 40]))
    finally:
        done.set()
        reader.join()
    assert errors == []
    assert not list(tmp_path.glob(".state.json.partial"))


def test_a_helper_that_erased_its_environment_is_remembered_and_stopped(tmp_path: Path) -> None:
    """vLLM's EngineCore calls setproctitle, which overwrites the environment /proc shows: the
    marker is gone. With its API server killed it ran on unseen (1.9 GB): status said stopped,
    down left it. Remembered once the part is ready, it is found and stopped."""
    cfg = config(tmp_path)
    argv = [sys.executable, "-c", "import subprocess, time; "
            "subprocess.Popen(['sleep', '300'], env={}); time.sleep(300)"]  # fmt: skip
    record = supervisor.spawn("engine", argv, "http://127.0.0.1:1", tmp_path / "engine.log")
    deadline = time.monotonic() + 10
    while len(supervisor._group(record.pid)) < 2:
        assert time.monotonic() < deadline, "the helper did not start"
        time.sleep(0.05)
    helper = next(pid for pid, _ in supervisor._group(record.pid) if pid != record.pid)
    assert supervisor.group_members(record) == [record.pid]  # unseen by its marker alone
    known = supervisor.remember_members(record)
    assert sorted(supervisor.group_members(known)) == sorted([record.pid, helper])
    stack._save_state(stack.StackState(config=cfg, processes=[known]))
    assert stack.status(tmp_path)[0]["leftover_processes"] == []  # a running part's own helper
    os.kill(record.pid, signal.SIGKILL)
    while supervisor.alive(record):
        time.sleep(0.05)
    row = stack.status(tmp_path)[0]
    assert row["running"] is False and row["leftover_processes"] == [helper]
    assert stack.down(tmp_path, quiet=True) == ["engine"]
    assert not Path(f"/proc/{helper}").exists() or supervisor._stat_fields(helper)[0] == "Z"


def test_status_from_another_directory_says_where_the_stack_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It said "the local stack is not running" while one served from another directory."""
    fake_parts(monkeypatch)
    stack_dir, elsewhere = tmp_path / "stack", tmp_path / "elsewhere"
    stack.up(config(stack_dir))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "dflash_ops.cli", "local", "status",
             "--state-dir", str(elsewhere)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 1
        assert f"not running in {elsewhere}" in done.stdout
        assert f"a stack runs in {stack_dir}: dflash-serve local status" in done.stdout
    finally:
        stack.down(stack_dir, quiet=True)
    again = subprocess.run(
        [sys.executable, "-m", "dflash_ops.cli", "local", "status", "--state-dir", str(elsewhere)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert f"a stack runs in {stack_dir}:" not in again.stdout  # down took it off the list


def test_a_key_rotation_beside_another_command_is_refused(tmp_path: Path) -> None:
    """Two `local rotate-key` at once could lose a key (one said done, then 401)."""
    from dflash_ops import directory_lock

    with (
        directory_lock.holding(tmp_path, "rotate the key"),
        pytest.raises(UserError, match=r"cannot rotate the key: `dflash-serve[^`]*` \(pid"),
    ):
        stack.rotate_key(tmp_path, None)


def test_a_process_no_state_names_is_shown_and_stopped(tmp_path: Path) -> None:
    """A `local up` killed between starting a part and writing it down left it unnamed: every
    process the stack starts carries the stack's scope in its marker, so status shows it and
    down (or the next up) stops it."""
    stray = supervisor.spawn(
        "engine", ["sleep", "300"], "http://127.0.0.1:1", tmp_path / "engine.log",
        scope=supervisor.scope_of(tmp_path),
    )  # fmt: skip
    other = supervisor.spawn(
        "engine", ["sleep", "300"], "http://127.0.0.1:1", tmp_path / "other.log",
        scope=supervisor.scope_of(tmp_path / "another-stack"),
    )  # fmt: skip
    try:
        rows = stack.status(tmp_path)
        assert [(r["name"], r["pid"]) for r in rows] == [("unrecorded", stray.pid)]
        stack.down(tmp_path, quiet=True)
        assert not supervisor.alive(stray) and supervisor.alive(other)
    finally:
        supervisor.stop_process(other)
        supervisor.stop_process(stray)
