"""`bench router-policies` without engines: the router command line, the report, the flags."""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from dflash_ops.bench.router_policies import PolicyRun, RouterPolicyReport, measure, table
from dflash_ops.cli.bench.router_policies import policy_list
from dflash_ops.errors import UserError
from dflash_ops.local import stack
from dflash_ops.local.router import router_argv
from dflash_ops.local.supervisor import ProcessRecord


def run(policy: str, hit_rate: float | None, share: dict[str, float]) -> PolicyRun:
    return PolicyRun(
        policy=policy, hit_rate=hit_rate, hit_tokens=0, queried_tokens=0, share=share,
        ttft_p50_ms=10, ttft_p99_ms=90, output_tokens_per_s=100, failed=0,
    )  # fmt: skip


def test_the_report_compares_each_policy_with_one_replica() -> None:
    report = RouterPolicyReport(
        scale_out=True, replicas=2, prefix_groups=8, requests=48,
        runs=[run("single replica", 0.8, {}), run("cache_aware", 0.8, {"a": 0.6, "b": 0.4}),
              run("round_robin", 0.72, {"a": 0.5, "b": 0.5}), run("random", None, {})],
    )  # fmt: skip
    rows = {line.split(" | ")[0][2:]: line for line in table(report).splitlines() if "|" in line}
    assert "| 0.800 | 1.00x | 60%, 40% |" in rows["cache_aware"]
    assert "| 0.720 | 0.90x | 50%, 50% |" in rows["round_robin"]
    assert "| n/a | n/a | all on one |" in rows["random"]


def test_the_router_command_line_is_what_vllm_router_parses() -> None:
    argv = router_argv(
        ["http://a:1", "http://b:2"], "cache_aware", 80, 81, ["--cache-threshold=0.5"]
    )
    assert argv[argv.index("--worker-urls") + 1 : argv.index("--policy")] == [
        "http://a:1", "http://b:2"
    ]  # fmt: skip
    # The real binary's own parser accepts it (no server is started by --help).
    parsed = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=60)
    assert parsed.returncode == 0 and "--policy" in parsed.stdout
    refused = subprocess.run(
        [*argv[:-1], "--policy=no_such_policy"], capture_output=True, text=True, timeout=60
    )
    assert refused.returncode != 0 and "no_such_policy" in refused.stderr


@pytest.mark.parametrize("text", ["", "cache", "cache_aware,kv", ","])
def test_unknown_policies_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected policies from"):
        policy_list(text)


def test_out_must_be_a_file(tmp_path: object) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dflash_ops.cli", "bench", "router-policies",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "is a directory" in done.stderr


def test_the_replicas_start_together_and_all_stop_when_one_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shared models are built once, then every replica's stack starts at the same time
    (the barrier lets none through until all three are starting); one that fails stops them
    all and its error is what the user sees."""
    calls: list[tuple[str, str]] = []
    together = threading.Barrier(3, timeout=20)

    def fake_up(config: stack.StackConfig) -> stack.StackState:
        calls.append(("up", config.state_dir.name))
        together.wait()
        if config.state_dir.name == "replica-1":
            raise UserError("engine-1 exited while engine starting")
        engine = ProcessRecord(
            name="engine", pid=1, url=f"http://127.0.0.1:{config.engine_port}", log="", argv=[]
        )
        return stack.StackState(config=config, processes=[engine])

    def fake_down(state_dir: Path, quiet: bool = False) -> list[str]:
        calls.append(("down", state_dir.name))
        return []

    monkeypatch.setattr(
        stack, "ensure_models", lambda config: calls.append(("models", config.state_dir.name))
    )
    monkeypatch.setattr(stack, "up", fake_up)
    monkeypatch.setattr(stack, "down", fake_down)
    with pytest.raises(UserError, match="engine-1 exited"):
        measure(
            tmp_path, replicas=3, policies=["round_robin"], prefix_groups=2, requests=4,
            concurrency=1, input_len=16, max_tokens=4, enforce_eager=True,
        )  # fmt: skip
    assert calls[0] == ("models", "replica-0")
    assert sorted(name for what, name in calls if what == "up") == [
        "replica-0", "replica-1", "replica-2",
    ]  # fmt: skip
    assert {name for what, name in calls if what == "down"} == {
        "replica-0", "replica-1", "replica-2",
    }  # fmt: skip
