"""Randomized faults against the local stack's bookkeeping, on real processes and ports: each
part a stand-in (tests.ops.local.fake_stack), one stack or two replicas behind a router. An
episode starts the stack, kills a part, restarts it with `local up`, and at a random moment
runs `local down`, Ctrl-C, SIGTERM or kill -9 of that `up`, a second `up`, or a `bench sweep`
pointed at the same state directory. Then `local status` must name every process of the stack
and nothing that is not there, and `local down` must leave no process and no listener. A failing
seed is kept in KEPT_SEEDS as a fixed case."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dflash_ops.local import stack, supervisor
from dflash_ops.loopback import free_port

from tests.conftest import REPO_ROOT

FAULTS = ("down", "sigint", "sigterm", "sigkill", "second-up", "sweep", "none")
# Seed s runs fault FAULTS[s % 7] on 1 + (s // 7) % 2 replicas: 14 seeds cover each fault on each
# topology; the seed draws the rest (the part killed, whole group or leader, the moment).
EPISODES = 14
# (seed, replicas, fault) that once failed, kept as fixed cases: a SIGTERM landing inside
# spawn() left a part no record named (found exploring seeds 16-59).
KEPT_CASES = [(36, 2, "sigterm")]


def consecutive_free_ports(count: int) -> int:
    for _ in range(50):
        base = free_port()
        if all(_free(base + i) for i in range(count)):
            return base
    raise AssertionError("no consecutive free ports")


def _free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def tagged(state_dir: Path) -> dict[int, list[str]]:
    """Every live stand-in of this episode (parts and helpers), by pid: their command lines
    carry the state directory."""
    found = {}
    tag = str(state_dir).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        fields = supervisor._stat_fields(entry.name)
        if tag in cmdline and fields is not None and fields[0] != "Z":
            found[int(entry.name)] = fields
    return found


class Episode:
    def __init__(self, seed: int, root: Path, replicas: int) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.state_dir = root / "stack"
        self.replicas = replicas
        engine, sidecars, prometheus = free_port(), consecutive_free_ports(2), free_port()
        self.flags = [
            "--state-dir", str(self.state_dir), "--engine-port", str(engine),
            "--sidecar-port", str(sidecars), "--prometheus-port", str(prometheus),
        ]  # fmt: skip
        self.ports = [engine, sidecars, prometheus]
        if self.replicas == 2:
            replicas, router_metrics = consecutive_free_ports(2), free_port()
            self.flags += [
                "--replicas", "2", "--replica-base-port", str(replicas),
                "--router-metrics-port", str(router_metrics),
            ]  # fmt: skip
            self.ports += [sidecars + 1, replicas, replicas + 1, router_metrics]
        self.runs = 0
        self.log: list[str] = [f"seed {seed}, replicas {replicas}"]

    def argv(self, action: str) -> list[str]:
        self.runs += 1
        command = [sys.executable, "-m", "tests.ops.local.fake_stack", "--delay-seed",
                   str(self.seed * 100 + self.runs)]  # fmt: skip
        if action == "sweep":  # a sweep pointed at the stack's directory
            return [*command, "bench", "sweep", "--deployer", "local", *self.flags[:2],
                    "--k", "0", "--concurrency", "1", "--num-requests", "1", "--repeats", "1",
                    "--warmup", "1", "--out", str(self.state_dir.parent / "sweep")]  # fmt: skip
        flags = {"up": self.flags, "status": [*self.flags[:2], "--format", "json"]}
        return [*command, "local", action, *flags.get(action, self.flags[:2])]

    def start(self, action: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(action), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=REPO_ROOT,
        )  # fmt: skip

    def run(self, action: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            self.argv(action), capture_output=True, text=True, timeout=120, cwd=REPO_ROOT
        )
        self.log.append(f"{action}: rc {done.returncode} {done.stderr.strip()[-300:]}")
        return done

    def finish(self, process: subprocess.Popen[str], what: str) -> None:
        _, err = process.communicate(timeout=120)
        self.log.append(f"{what}: rc {process.returncode} {err.strip()[-300:]}")


def check_status(episode: Episode) -> None:
    """status names every live process of the stack (a part, its helper or a leftover) and
    calls nothing running that is not."""
    done = episode.run("status")
    rows = json.loads(done.stdout)
    live = tagged(episode.state_dir)
    for row in rows:
        if row["running"]:
            assert row["pid"] in live, (row, episode.log)
    accounted = set()
    for row in rows:
        if row["running"]:
            group = {pid for pid, fields in live.items() if fields[2] == str(row["pid"])}
            accounted |= group | {row["pid"]}
        accounted |= set(row["leftover_processes"])
    missed = set(live) - accounted
    assert not missed, (missed, rows, episode.log)


def episode_of(seed: int, root: Path, replicas: int, fault: str) -> None:
    episode = Episode(seed, root, replicas)
    rng = episode.rng
    first = episode.run("up")
    assert first.returncode == 0, episode.log
    state = stack.load_state(episode.state_dir)
    assert state is not None
    victim = rng.choice(state.processes)
    whole = rng.random() < 0.5
    episode.log.append(f"kill -9 {victim.name} ({'group' if whole else 'leader'})")
    if whole:
        os.killpg(victim.pid, signal.SIGKILL)
    else:
        os.kill(victim.pid, signal.SIGKILL)
    restart = episode.start("up")
    time.sleep(rng.uniform(0.0, 1.5))
    episode.log.append(f"fault {fault}")
    signals = {"sigint": signal.SIGINT, "sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}
    if fault == "down":
        episode.run("down")
    elif fault in signals:
        restart.send_signal(signals[fault])
    elif fault in ("second-up", "sweep"):
        episode.finish(episode.start("up" if fault == "second-up" else "sweep"), fault)
    episode.finish(restart, "restart")
    check_status(episode)
    stopped = episode.run("down")
    assert stopped.returncode == 0, episode.log
    deadline = time.monotonic() + 15
    while tagged(episode.state_dir) and time.monotonic() < deadline:
        time.sleep(0.1)  # a helper killed with its group may take a moment to be reaped
    assert not tagged(episode.state_dir), episode.log
    busy = [port for port in episode.ports if not _free(port)]
    assert not busy, (busy, episode.log)


CASES = [*KEPT_CASES, *((s, 1 + (s // 7) % 2, FAULTS[s % 7]) for s in range(EPISODES))]


@pytest.mark.parametrize(("seed", "replicas", "fault"), CASES)
def test_no_fault_leaves_a_process_or_a_port_or_a_wrong_status(
    seed: int, replicas: int, fault: str, tmp_path: Path
) -> None:
    episode_of(seed, tmp_path, replicas, fault)
