"""Garbage for every flag of every subcommand: the CLI answers with one line naming the value
and exits 2, never with a traceback, and never accepts a value that would run unbounded.

Two layers: every argument type of the real parser (found by walking it, not listed by hand) is
fed hostile text by hypothesis and must return a finite value within bounds or refuse it; and a
table of whole invocations with hostile files and values runs the real `dflash-serve` process.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dflash_ops.cli import build_parser
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

HOSTILE_NUMBERS = [
    "nan", "NaN", "inf", "-inf", "Infinity", "1e308", "1e309", "-1e308", "1e20", "-1", "0",
    "-0", "0.0", "", " ", "1_000", "0x10", "1e-320", "9" * 400, "1,2", "١٢", "\x00", "1.5",
    "2147483648", "-2147483649",
]  # fmt: skip


def typed_actions() -> list[tuple[str, argparse.Action]]:
    """(subcommand path + flag, action) of every argument with a type converter."""
    found: list[tuple[str, argparse.Action]] = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}".strip())
            elif callable(action.type) and action.type not in (str, Path):
                flag = action.option_strings[-1] if action.option_strings else action.dest
                found.append((f"{path} {flag}", action))

    walk(build_parser(), "")
    return found


ACTIONS = typed_actions()


def test_the_walk_finds_the_numeric_flags() -> None:
    names = {name for name, _ in ACTIONS}
    for expected in (
        "plan --gpu-memory-gib",
        "bench --concurrency",
        "bench --duration",
        "bench sidecar --hours",
        "local up --engine-timeout",
    ):
        assert expected in names, sorted(names)


def accepted_values(value: object) -> list[float]:
    if isinstance(value, list | tuple):
        return [v for item in value for v in accepted_values(item)]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return [float(value)]
    return []


@pytest.mark.parametrize(("name", "action"), ACTIONS, ids=[name for name, _ in ACTIONS])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(st.sampled_from(HOSTILE_NUMBERS), st.text(max_size=30)))
def test_every_argument_type_refuses_or_returns_a_bounded_finite_value(
    name: str, action: argparse.Action, text: str
) -> None:
    assert callable(action.type)
    try:
        value = action.type(text)
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        return  # argparse turns these into `error: argument X: ...`, exit 2
    for number in accepted_values(value):
        if number == math.inf and name.endswith("--request-rate"):
            continue  # vllm bench serve's rate inf: every request at once (capped)
        assert math.isfinite(number), f"{name} accepted {text!r} as {number}"
        assert abs(number) <= 2**32, f"{name} accepted {text!r} as {number}: unbounded"


def run_cli(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "DFLASH_"))}
    env["HOME"] = str(cwd)
    return subprocess.run(
        [sys.executable, "-m", "dflash_ops.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
    )


@pytest.fixture(scope="module")
def hostile_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    (root / "binary").write_bytes(bytes(range(256)) * 4)
    (root / "bad.yaml").write_text("a: [1, 2\nb: }\n")
    (root / "list.yaml").write_text("- 1\n- 2\n")
    (root / "bad.json").write_text("{not json")
    (root / "a-dir").mkdir()
    (root / "huge-layers.json").write_text(
        '{"num_hidden_layers": 1e9, "hidden_size": 2560, "num_attention_heads": 32}'
    )
    (root / "results").mkdir()
    (root / "results" / "results.json").mkdir()  # results.json is a directory
    series = root / "series"
    series.mkdir()
    (series / "manifest.json").write_text('{"vllm_version": 3, "patches": "no"}')
    binary_series = root / "binary-series"
    binary_series.mkdir()
    (binary_series / "manifest.json").write_bytes(bytes(range(256)))
    (root / "a-file").write_text("x")
    return root


NO_PROM = ["--no-prometheus"]
PATCHES = ["patches", "check", "--site-packages", "{a-dir}"]
CASES = {
    # plan: numbers, binary and absurd configs
    "plan-inf-memory": (["plan", "--gpu-memory-gib", "inf"], "--gpu-memory-gib"),
    "plan-huge-weights": (["plan", "--weights-gib", "1e308"], "--weights-gib"),
    "plan-binary-config": (["plan", "--config", "{binary}"], "not UTF-8"),
    "plan-binary-draft": (["plan", "--draft-config", "{binary}"], "not UTF-8"),
    "plan-dir-draft": (["plan", "--draft-config", "{a-dir}"], "not found"),
    "plan-bad-json": (["plan", "--config", "{bad.json}"], "not valid JSON"),
    "plan-1e9-layers": (["plan", "--draft-config", "{huge-layers.json}"], "num_hidden_layers"),
    # bench: URLs, loads that would never end, a results.json that is a directory
    "bench-bad-ipv6": (["bench", "--base-url", "http://[::1"], "--base-url"),
    "bench-concurrency": (["bench", "--concurrency", "1e20"], "--concurrency"),
    "bench-duration-inf": (["bench", "--duration", "inf"], "--duration"),
    "bench-repeats": (["bench", "--repeats", "100000000000000000000"], "--repeats"),
    "bench-rate-nan": (["bench", "--request-rate", "nan"], "--request-rate"),
    "bench-compare-dir": (["bench", "compare", "{results}", "{results}"], "is a directory"),
    "bench-sidecar-nan": (["bench", "sidecar", "--hours", "nan"], "--hours"),
    "bench-sidecar-interval": (["bench", "sidecar", "--scrape-interval", "1e308"], "--scrape"),
    # local
    "local-state-file": (["local", "up", "--state-dir", "{a-file}", *NO_PROM], "--state-dir"),
    "local-state-proc": (["local", "up", "--state-dir", "/proc/1/x", *NO_PROM], "--state-dir"),
    "local-timeout-nan": (["local", "up", "--engine-timeout", "nan"], "--engine-timeout"),
    "local-timeout-0": (["local", "up", "--engine-timeout", "0"], "--engine-timeout"),
    "local-noise-inf": (["local", "up", "--draft-noise", "inf"], "--draft-noise"),
    "local-models": (["local", "up", "--models", "huge"], "--models"),
    "local-noise-paying": (
        ["local", "up", "--models", "paying", "--draft-noise", "-1"], "--draft-noise"
    ),
    "sweep-schedule": (["bench", "sweep", "--schedule", "1-4:banana"], "--schedule"),
    "sweep-models-helm": (
        ["bench", "sweep", "--deployer", "helm", "--models", "paying", "--release", "r",
         "--base-url", "http://127.0.0.1:1"], "--models",
    ),
    # patches
    "patches-schema": ([*PATCHES, "--series-dir", "{series}"], "manifest"),
    "patches-binary": ([*PATCHES, "--series-dir", "{binary-series}"], "manifest"),
    # preflight and render: values files, kubeconfigs, names
    "preflight-kubeconfig-bad": (["preflight", "--kubeconfig", "{bad.yaml}"], "--kubeconfig"),
    "preflight-kubeconfig-binary": (["preflight", "--kubeconfig", "{binary}"], "--kubeconfig"),
    "preflight-kubeconfig-dir": (["preflight", "--kubeconfig", "{a-dir}"], "--kubeconfig"),
    "preflight-values-bad": (["preflight", "-f", "{bad.yaml}"], "values file"),
    "preflight-values-binary": (["preflight", "-f", "{binary}"], "values file"),
    "preflight-values-list": (["preflight", "-f", "{list.yaml}"], "expected a mapping"),
    "render-namespace": (["render", "--namespace", "a b"], "--namespace"),
    "render-values-list": (["render", "-f", "{list.yaml}"], "expected a mapping"),
    # the sidecar's settings (validated by the sidecar itself)
    "sidecar-interval-nan": (["sidecar", "--scrape-interval", "nan"], "scrape_interval"),
    "sidecar-page-huge": (["sidecar", "--max-page-bytes", "1e30"], "max_page_bytes"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_invocations_end_with_one_line_naming_the_problem(
    case: str, hostile_files: Path
) -> None:
    args, named = CASES[case]
    argv = [
        str(hostile_files / a[1:-1]) if a.startswith("{") and a.endswith("}") else a for a in args
    ]
    result = run_cli(*argv, cwd=hostile_files)
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output[-3000:]
    assert result.returncode == 2, (result.returncode, output[-2000:])
    assert named in output, output[-2000:]
