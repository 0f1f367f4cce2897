"""`dflash-serve bench sweep`: the recommendation and prediction over known figures, the helm
deployer's commands and rollback with a stand-in helm (the benchmark itself runs against real
servers), resuming, and the recommended values rendered by the real helm."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from dflash_ops.bench.core.results import (
    BenchResult,
    BenchSettings,
    LevelResult,
    Percentiles,
    SpecDecodeStats,
    Spread,
)
from dflash_ops.bench.sweep.analysis import analyse, recommended_values, table
from dflash_ops.bench.sweep.deployers import LocalDeployer, Setting
from dflash_ops.chart.helm import helm_template
from dflash_ops.errors import UserError
from dflash_ops.speculative_schedule import parse_schedule

from tests.conftest import REPO_ROOT

SETTINGS = BenchSettings(
    prompt_set="fixed", input_len=1, max_tokens=8, num_requests=4, duration_s=None,
    repeats=2, warmup=0, seed=0,
)  # fmt: skip


def level(
    concurrency: int, tps: float, stdev: float, tpot_p99: float, per_pos: list[float]
) -> LevelResult:
    spread = Spread(mean=tps, min=tps - stdev, max=tps + stdev, stdev=stdev, runs=2)
    drafts = 100.0
    spec = None
    if per_pos:
        accepted = sum(per_pos) * drafts
        spec = SpecDecodeStats(
            drafts=drafts, draft_tokens=drafts * len(per_pos), accepted=accepted,
            mean_acceptance_length=1 + accepted / drafts,
            draft_acceptance_rate=accepted / (drafts * len(per_pos)),
            per_position_acceptance=per_pos,
        )  # fmt: skip
    p = Percentiles(mean=tpot_p99, p50=tpot_p99 / 2, p90=tpot_p99, p99=tpot_p99, count=8)
    return LevelResult(
        concurrency=concurrency, request_rate=None, runs=[], output_tokens_per_s=spread,
        requests_per_s=spread, ttft_ms=p, tpot_ms=p, itl_ms=p, e2e_ms=p, spec_decode=spec,
    )  # fmt: skip


def result(*levels: LevelResult) -> BenchResult:
    return BenchResult(
        base_url="http://x", model="m", started_at="t", settings=SETTINGS, levels=list(levels),
        kv_cache_tokens=None,
    )  # fmt: skip


CURVE = [0.9, 0.7, 0.5, 0.3]


def test_recommendation_prefers_the_smallest_k_within_the_spread_of_the_fastest() -> None:
    results = {
        Setting(0, "dflash"): result(level(1, 100, 2, 50, []), level(4, 300, 5, 60, [])),
        Setting(2, "dflash"): result(
            level(1, 150, 3, 30, CURVE[:2]), level(4, 390, 8, 40, CURVE[:2])
        ),
        Setting(4, "dflash"): result(level(1, 180, 3, 25, CURVE), level(4, 400, 8, 45, CURVE)),
    }  # fmt: skip
    analysis = analyse(results)
    by_level = {r.level: r for r in analysis.recommendations}
    # Concurrency 1: k=4 is clearly fastest. Concurrency 4: k=2 (390 ± 8) reaches k=4's
    # 400 - 8, so the smaller k wins the tie.
    assert by_level["concurrency 1"].recommended == "dflash-k4"
    assert by_level["concurrency 4"].fastest == "dflash-k4"
    assert by_level["concurrency 4"].recommended == "dflash-k2"
    assert by_level["concurrency 4"].within_spread == ["dflash-k2", "dflash-k4"]
    assert by_level["concurrency 4"].lowest_tpot_p99 == "dflash-k2"
    # Predicted acceptance length for k=2 from the k=4 curve: 1 + 0.9 + 0.7.
    prediction = next(p for p in analysis.predictions if p.level == "concurrency 1")
    assert (prediction.k, prediction.from_k) == (2, 4)
    assert prediction.predicted_mean_acceptance_length == pytest.approx(2.6)
    assert prediction.measured_mean_acceptance_length == pytest.approx(2.6)
    # The planner's KV capacity shrinks as k grows (more blocks per request).
    assert analysis.kv_cache_tokens[2] >= analysis.kv_cache_tokens[4] > 0
    values = yaml.safe_load(recommended_values(analysis, results))
    assert values == {
        "speculative": {"method": "dflash", "numSpeculativeTokens": 2},
        "engine": {"blockSize": "auto"},
    }


def test_recommended_values_render_with_the_chart(tmp_path: Path) -> None:
    """What the sweep writes is accepted by the chart as it is (schema, block-size rule)."""
    for setting in (Setting(0, "dflash"), Setting(3, "draft_model"), Setting(5, "mtp")):
        results = {setting: result(level(1, 10, 1, 5, CURVE[: setting.k]))}
        analysis = analyse(results, with_capacity=False)
        path = tmp_path / f"{setting.key}.yaml"
        path.write_text(recommended_values(analysis, results))
        rendered = helm_template([path], [], "dflash", "llm")
        if setting.k:
            assert f'\\"num_speculative_tokens\\":{setting.k}}}' in rendered
            assert f'\\"method\\":\\"{setting.chart_method}\\"' in rendered
        else:
            assert "--speculative-config" not in rendered


def test_a_local_sweep_never_takes_over_a_users_running_stack(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text(
        json.dumps({"config": {"state_dir": str(tmp_path)}, "processes": []})
    )
    with pytest.raises(UserError, match="a local stack this sweep did not start runs in"):
        LocalDeployer(tmp_path, 18000, 19000)


def stand_in(tmp_path: Path, values: dict[str, Any]) -> tuple[Path, dict[str, str]]:
    wrapper = tmp_path / "helm"
    wrapper.write_text(
        f'#!/bin/sh\nexec {sys.executable} {REPO_ROOT / "tests/ops/bench/stand_in_helm.py"} "$@"\n'
    )
    wrapper.chmod(0o755)
    log = tmp_path / "helm.log"
    env = os.environ | {
        "STAND_IN_HELM_LOG": str(log),
        "STAND_IN_HELM_VALUES": yaml.safe_dump(values),
    }
    return wrapper, env


def calls(env: dict[str, str]) -> list[list[str]]:
    path = Path(env["STAND_IN_HELM_LOG"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def sweep_command(base_url: str, out: Path, helm: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "dflash_ops.cli", "bench", "sweep", "--deployer", "helm",
        "--release", "dflash", "--namespace", "llm", "--base-url", base_url, "--helm", str(helm),
        "--k", "0,4", "--method", "dflash,mtp", "--concurrency", "1,2", "--num-prompts", "3",
        "--repeats", "1", "--warmup", "0", "--max-tokens", "4", "--out", str(out), *extra,
    ]  # fmt: skip


def test_helm_sweep_upgrades_per_setting_and_restores_the_original_values(
    instant_server: str, tmp_path: Path
) -> None:
    original = {"replicas": 2, "speculative": {"method": "dflash", "numSpeculativeTokens": 7}}
    helm, env = stand_in(tmp_path, original)
    out = tmp_path / "out"
    done = subprocess.run(
        sweep_command(instant_server, out, helm), capture_output=True, text=True, timeout=300,
        env=env, cwd=REPO_ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    log = calls(env)
    assert log[0] == ["get", "values", "dflash", "--namespace", "llm", "-o", "yaml"]
    upgrades = [c for c in log if c[0] == "upgrade"]
    sets = [[c[i + 1] for i, a in enumerate(c) if a == "--set"] for c in upgrades[:-1]]
    assert sets == [
        ["speculative.method=off", "engine.blockSize=auto"],
        [
            "speculative.method=dflash",
            "speculative.numSpeculativeTokens=4",
            "engine.blockSize=auto",
        ],
        ["speculative.method=mtp", "speculative.numSpeculativeTokens=4", "engine.blockSize=auto"],
    ]
    for call in upgrades[:-1]:
        assert call[1:3] == ["dflash", str(REPO_ROOT / "charts" / "dflash-serve")]
        assert "--reuse-values" in call and "--wait" in call
    restore = upgrades[-1]
    assert "--reset-values" in restore and "--wait" in restore
    saved = Path(restore[restore.index("--values") + 1])
    assert yaml.safe_load(saved.read_text()) == original
    analysis = json.loads((out / "sweep-results.json").read_text())
    assert {p["key"] for p in analysis["points"]} == {"off", "dflash-k4", "mtp-k4"}
    assert len(analysis["recommendations"]) == 2
    for picture in (
        "throughput.png", "latency.png", "acceptance-by-k.png", "speedup.png", "pareto.png"
    ):  # fmt: skip
        assert (out / picture).read_bytes()[:4] == b"\x89PNG"
    # Each point's vLLM-format records name their setting as the engine's flags name it.
    exported = [
        r for path in out.rglob("vllm/*/summary.json") for r in json.loads(path.read_text())
    ]
    assert {(r["speculative_method"], r["num_speculative_tokens"]) for r in exported} == {
        ("off", "0"), ("dflash", "4"), ("mtp", "4")
    }  # fmt: skip
    assert "| level | recommended |" in done.stdout
    rendered = helm_template([out / "recommended-values.yaml"], [], "dflash", "llm")
    assert "kind: Deployment" in rendered


def interrupt_once_measuring(command: list[str], env: dict[str, str], point: Path) -> str:
    """Start the sweep, Ctrl-C it once `point` has a request written; its stderr (exit 130)."""
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT
    )
    requests = point / "requests.jsonl"
    deadline = time.monotonic() + 120
    while not (requests.is_file() and requests.read_text()):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    return stderr


def run_again(command: list[str], env: dict[str, str]) -> tuple[str, list[list[str]]]:
    """The same command to the end: its stderr and the helm calls it made."""
    before = len(calls(env))
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env=env, cwd=REPO_ROOT
    )
    assert done.returncode == 0, done.stderr
    return done.stderr, calls(env)[before:]


def test_ctrl_c_restores_the_release_and_the_same_command_resumes(
    scripted_server: str, tmp_path: Path
) -> None:
    helm, env = stand_in(tmp_path, {"replicas": 1})
    out = tmp_path / "out"
    command = sweep_command(f"{scripted_server}/slow", out, helm)
    stderr = interrupt_once_measuring(command, env, out / "points" / "dflash-k4")
    assert "the same command resumes" in stderr
    log = calls(env)
    assert "--reset-values" in log[-1]  # the release got its values back
    state = json.loads((out / "sweep.json").read_text())
    assert state["done"] == ["off"]
    stderr, again = run_again(command, env)
    assert "resuming: 1 of 3 settings measured" in stderr
    assert not any(c[:2] == ["get", "values"] for c in again)  # the first original is kept
    upgraded = [c[c.index("--set") + 1] for c in again if "--reuse-values" in c]
    assert upgraded == ["speculative.method=dflash", "speculative.method=mtp"]
    assert "--reset-values" in again[-1]
    assert json.loads((out / "sweep.json").read_text())["done"] == ["off", "dflash-k4", "mtp-k4"]
    # A different plan in the same folder is refused, not mixed in.
    other = subprocess.run(
        [*command[:-2], "--out", str(out), "--k", "0,2"], capture_output=True, text=True,
        timeout=120, env=env, cwd=REPO_ROOT,
    )  # fmt: skip
    assert other.returncode == 2 and "belongs to a sweep with other settings" in other.stderr


def test_a_failed_rollout_restores_the_release(instant_server: str, tmp_path: Path) -> None:
    helm, env = stand_in(tmp_path, {"replicas": 1})
    env["STAND_IN_HELM_FAIL_UPGRADE"] = "2"
    done = subprocess.run(
        sweep_command(instant_server, tmp_path / "out", helm), capture_output=True, text=True,
        timeout=300, env=env, cwd=REPO_ROOT,
    )  # fmt: skip
    assert done.returncode == 2 and "context deadline exceeded" in done.stderr
    assert "--reset-values" in calls(env)[-1]


def schedule_results(
    scheduled: list[tuple[float, float]],
) -> dict[Setting, BenchResult]:
    """off, k2 and k4 at concurrency 1, 4, 16, and a schedule measured as `scheduled`."""
    return {
        Setting(0, "dflash"): result(level(1, 100, 2, 50, []), level(4, 300, 5, 60, []),
                                     level(16, 900, 10, 70, [])),
        Setting(2, "dflash"): result(level(1, 150, 3, 30, CURVE[:2]),
                                     level(4, 390, 8, 40, CURVE[:2]),
                                     level(16, 880, 10, 60, CURVE[:2])),
        Setting(4, "dflash"): result(level(1, 180, 3, 25, CURVE), level(4, 400, 8, 45, CURVE),
                                     level(16, 700, 10, 80, CURVE)),
        Setting(4, "dflash", schedule=parse_schedule("1-2:4,3-8:2,9-:0", 4)): result(
            *(level(c, tps, sd, 40, CURVE) for c, (tps, sd) in zip((1, 4, 16), scheduled,
                                                                   strict=True))
        ),
    }  # fmt: skip


def test_a_schedule_within_the_spread_everywhere_is_recommended_and_rendered(
    tmp_path: Path,
) -> None:
    results = schedule_results([(179, 3), (396, 8), (905, 12)])
    analysis = analyse(results, with_capacity=False)
    verdict = analysis.schedule
    assert verdict is not None and verdict.recommended and verdict.shortfalls == []
    assert [lv.best_static for lv in verdict.levels] == ["dflash-k4", "dflash-k4", "off"]
    # Beyond both spreads: ahead of off and k=2 at concurrency 1 (176 > 153), of k=2 and k=4 at
    # 16; so ahead of every static setting at one level at least.
    assert verdict.levels[0].ahead_of == ["off", "dflash-k2"]
    assert verdict.levels[2].ahead_of == ["dflash-k2", "dflash-k4"]
    assert verdict.never_ahead_of == []
    text = table(analysis)
    assert "Ahead of every static setting beyond the spread" in text
    # The report says what its ± is: the repeats of one engine start, not between starts.
    assert "(± is the spread of the repeats within one engine start per setting" in text
    assert text.index("| level | recommended |") < text.index("(± is the spread")
    # The static recommendation leaves the schedule out.
    assert all("schedule" not in r.recommended for r in analysis.recommendations)
    path = tmp_path / "values.yaml"
    path.write_text(recommended_values(analysis, results))
    values = yaml.safe_load(path.read_text())
    assert values["speculative"] == {
        "method": "dflash", "numSpeculativeTokens": 4, "schedule": "1-2:4,3-8:2,9-:0",
    }  # fmt: skip
    rendered = helm_template([path], [], "dflash", "llm")
    assert '\\"num_speculative_tokens_per_batch_size\\":[[1,2,4],[3,8,2],[9,65536,0]]' in rendered


def test_a_schedule_short_of_the_best_static_somewhere_is_named_and_not_recommended() -> None:
    # At concurrency 16 the schedule (plain decoding there) reaches 760 ± 10: 0.84x of off.
    results = schedule_results([(179, 3), (396, 8), (760, 10)])
    analysis = analyse(results, with_capacity=False)
    verdict = analysis.schedule
    assert verdict is not None and not verdict.recommended
    assert verdict.shortfalls == [
        "concurrency 16: 0.84x of off (760.0 ± 10.0 against 900.0 ± 10.0 tok/s)"
    ]
    assert verdict.never_ahead_of == []  # ahead of k=2 and off at 1, of k=4 at 16
    text = recommended_values(analysis, results)
    assert "is not recommended: it fell short at concurrency 16: 0.84x of off" in text
    assert "schedule" not in yaml.safe_load(text)["speculative"]
    assert "Not recommended: fell short at concurrency 16" in table(analysis)


def test_a_schedule_that_only_matches_a_static_k_says_which_it_never_beats() -> None:
    # As fast as k=2 everywhere: never beyond its spread (and short of k=4 at concurrency 1).
    results = schedule_results([(150, 3), (390, 8), (880, 10)])
    analysis = analyse(results, with_capacity=False)
    verdict = analysis.schedule
    assert verdict is not None and verdict.never_ahead_of == ["dflash-k2"]
    assert "Never ahead beyond the spread of: dflash-k2." in table(analysis)


def test_the_helm_sweep_verifies_a_given_schedule_as_one_more_rollout(
    instant_server: str, tmp_path: Path
) -> None:
    helm, env = stand_in(tmp_path, {"speculative": {"schedule": "1-4:7"}})
    out = tmp_path / "out"
    command = sweep_command(instant_server, out, helm, "--schedule", "1-1:4;2-:0")
    command[command.index("--method") + 1] = "dflash"
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env=env, cwd=REPO_ROOT
    )
    assert done.returncode == 0, done.stderr
    upgrades = [c for c in calls(env) if c[0] == "upgrade" and "--reuse-values" in c]
    schedules = [c[c.index("--set-string") + 1] for c in upgrades]
    # The static settings clear the release's own schedule; the last rollout sets the given one.
    assert schedules == [
        "speculative.schedule=", "speculative.schedule=", "speculative.schedule=1-1:4;2-:0",
    ]  # fmt: skip
    analysis = json.loads((out / "sweep-results.json").read_text())
    assert analysis["schedule"]["schedule"] == "1-1:4,2-:0"
    assert [lv["level"] for lv in analysis["schedule"]["levels"]] == [
        "concurrency 1", "concurrency 2",
    ]  # fmt: skip
    assert json.loads((out / "sweep.json").read_text())["done"][-1] == "dflash-schedule"
    assert "k schedule `1-1:4,2-:0`" in (out / "sweep.md").read_text()


def test_ctrl_c_during_the_schedule_setting_restores_the_release_and_resumes_it(
    scripted_server: str, tmp_path: Path
) -> None:
    helm, env = stand_in(tmp_path, {"speculative": {"schedule": "1-4:7"}})
    out = tmp_path / "out"
    command = sweep_command(f"{scripted_server}/slow", out, helm, "--schedule", "1-1:4;2-:0")
    command[command.index("--method") + 1] = "dflash"
    stderr = interrupt_once_measuring(command, env, out / "points" / "dflash-schedule")
    assert "2 settings kept" in stderr and "the same command resumes" in stderr
    log = calls(env)
    assert "--reset-values" in log[-1]  # the release got its own schedule back
    saved = Path(log[-1][log[-1].index("--values") + 1])
    assert yaml.safe_load(saved.read_text()) == {"speculative": {"schedule": "1-4:7"}}
    state = json.loads((out / "sweep.json").read_text())
    assert state["done"] == ["off", "dflash-k4"]
    assert state["schedule_setting"]["schedule"] == "1-1:4,2-:0"
    stderr, again = run_again(command, env)
    assert "resuming: 2 of 2 settings measured" in stderr
    # Only the schedule is rolled out again, then the release's values come back.
    rollouts = [c[c.index("--set-string") + 1] for c in again if "--reuse-values" in c]
    assert rollouts == ["speculative.schedule=1-1:4;2-:0"]
    assert "--reset-values" in again[-1]
    assert json.loads((out / "sweep.json").read_text())["done"] == [
        "off", "dflash-k4", "dflash-schedule",
    ]  # fmt: skip
    analysis = json.loads((out / "sweep-results.json").read_text())
    assert analysis["schedule"]["setting"] == "dflash-schedule"


def test_a_derived_schedule_needs_the_running_batch(scripted_server: str, tmp_path: Path) -> None:
    """Speculation beats off at every level (the server streams 50 ms a token while the stand-in
    helm's last upgrade set off, instantly otherwise), but the server exports no
    vllm:num_requests_running: the sweep says it cannot place the levels and runs no schedule."""
    helm, env = stand_in(tmp_path, {"replicas": 1})
    server = f"{scripted_server}/off-slow/{tmp_path.name}"
    env["STAND_IN_HELM_NOTIFY"] = f"{server}/deployed"
    out = tmp_path / "out"
    done = subprocess.run(
        sweep_command(server, out, helm), capture_output=True, text=True, timeout=300, env=env,
        cwd=REPO_ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    analysis = json.loads((out / "sweep-results.json").read_text())
    assert analysis["schedule"] is None
    assert "no running batch was measured" in analysis["schedule_note"], analysis["schedule_note"]
    assert "No k schedule" in (out / "recommended-values.yaml").read_text()
    helm_runs = [c for c in calls(env) if c[:1] == ["upgrade"]]
    assert len(helm_runs) == 4  # off, dflash, mtp, the original values back: no schedule setting


@pytest.mark.parametrize(
    ("interrupt", "status"),
    [(KeyboardInterrupt(), 130), (KeyboardInterrupt("SIGTERM"), 143)],
    ids=["ctrl-c", "sigterm"],
)
def test_ctrl_c_while_a_local_settings_engine_starts_keeps_the_sweep_resumable(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    interrupt: KeyboardInterrupt,
    status: int,
) -> None:
    """Ctrl-C or SIGTERM during `local up` of a setting (the engine still loading) is the
    sweep's interruption: the stack stops what it started, the sweep says the same command
    resumes and exits 128 + the signal, as when a level is interrupted, not a one-line error
    with status 2."""
    from dflash_ops.cli import main
    from dflash_ops.local import stack

    def interrupted_start(
        config: stack.StackConfig, previous: object, started: object
    ) -> stack.StackState:
        raise interrupt  # what SIGINT (or stack's SIGTERM handler) raises while up() waits

    monkeypatch.setattr(stack, "_start", interrupted_start)
    exit_status = main(
        [
            "bench", "sweep", "--deployer", "local", "--state-dir", str(tmp_path / "stack"),
            "--k", "2,4", "--concurrency", "1", "--num-requests", "1", "--enforce-eager",
            "--out", str(tmp_path / "sweep"),
        ]
    )  # fmt: skip
    stderr = capsys.readouterr().err
    assert exit_status == status, stderr
    assert "interrupted: stopping what this command started" in stderr
    assert "the same command resumes" in stderr and "error:" not in stderr
    assert json.loads((tmp_path / "sweep" / "sweep.json").read_text())["done"] == []


def test_the_pareto_frontier_keeps_the_points_nothing_beats_on_both() -> None:
    from dflash_ops.bench.sweep.plots import pareto_frontier

    points = [(10.0, 100.0), (12.0, 90.0), (15.0, 150.0), (15.0, 140.0), (30.0, 150.0),
              (40.0, 200.0), (5.0, 50.0)]  # fmt: skip
    assert pareto_frontier(points) == [(5.0, 50.0), (10.0, 100.0), (15.0, 150.0), (40.0, 200.0)]
    assert pareto_frontier([]) == []


def test_two_sweeps_on_one_stack_directory_the_second_is_refused(tmp_path: Path) -> None:
    """Two sweeps from one folder shared `.sweep-stack` and stopped each other's engines."""
    from dflash_ops.bench.sweep.deployers import LocalDeployer

    first = LocalDeployer(tmp_path / ".sweep-stack", 1, 2)
    with pytest.raises(UserError, match=r"cannot run a sweep: `dflash-serve[^`]*` \(pid \d+\)"):
        LocalDeployer(tmp_path / ".sweep-stack", 1, 2)
    first.finish()
    LocalDeployer(tmp_path / ".sweep-stack", 1, 2).finish()  # released with the first
