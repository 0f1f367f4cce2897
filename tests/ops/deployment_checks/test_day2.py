"""The day-2 cluster script (it needs a GPU cluster; here: its dry run, and every helm and
kubectl command it would run checked against those tools' own flag parsing)."""

from __future__ import annotations

import shlex
import subprocess
import sys

from dflash_ops.chart.helm import helm_binary

from tests.conftest import REPO_ROOT


def dry_run(*args: str) -> list[list[str]]:
    result = subprocess.run(
        [sys.executable, "-m", "dflash_ops.deployment_checks.day2", "--dry-run", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr
    return [shlex.split(line[2:]) for line in result.stderr.splitlines() if line.startswith("$ ")]


def test_the_dry_run_walks_every_step_with_the_same_values() -> None:
    commands = dry_run(
        "--profile", "a100-tp2-dflash2", "--set", "replicas=1", "--api-key-secret", "k"
    )
    helm = [c for c in commands if c[0].endswith("helm")]
    verbs = [c[1] for c in helm]
    assert verbs == ["install", "test", "upgrade", "rollback", "uninstall"]
    install = helm[0]
    assert "--wait" in install and "auth.apiKeySecret.name=k" in install
    # --wait gets the chart's rollout budget (the Deployment's progressDeadlineSeconds).
    assert install[install.index("--timeout") + 1] == "8100s"
    preflight = next(c for c in commands if "preflight" in c)
    values = install[install.index("-f") : install.index("--wait")]
    assert shlex.join(values) in shlex.join(preflight)  # the same value arguments
    assert any(c[:1] == ["kubectl"] and "port-forward" in c for c in commands)


def test_helm_accepts_every_command_the_script_runs() -> None:
    """helm's own parser on each command (with --help appended nothing runs): an unknown flag
    fails with `unknown flag`."""
    for command in dry_run("--profile", "a100-tp2-dflash2", "--api-key-secret", "k"):
        if not command[0].endswith("helm"):
            continue
        probe = subprocess.run(
            [helm_binary(), *command[1:], "--help"], capture_output=True, text=True, timeout=60
        )
        assert probe.returncode == 0, f"{shlex.join(command)}: {probe.stderr}"
