"""`bench sweep --step-cost-from DIR`: the sidecar baseline built from an earlier sweep and its
refusals, the sweep asking the watched setting's sidecar at the end of every level (a sidecar
answering as GET /recommendation does, recorded; the real sidecar against the real engine is
tests/e2e/test_bench_sweep.py's), and each prediction set against the static settings'
measurements."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from dflash_ops.bench.core.levels import Level
from dflash_ops.bench.core.results import RunningBatch
from dflash_ops.bench.sweep import live_predictions
from dflash_ops.bench.sweep.deployers import Setting
from dflash_ops.bench.sweep.live_predictions import LevelPrediction, compare, record_level, table
from dflash_ops.bench.sweep.run import SweepPlan, run_sweep
from dflash_ops.bench.sweep.step_cost_report import sidecar_baseline
from dflash_ops.errors import UserError
from dflash_sidecar.recommendation import recommend

from tests.ops.bench.test_step_cost_fit import write_sweep
from tests.ops.bench.test_sweep import SETTINGS, level, result
from tests.service.test_recommendation import MODEL

K4 = Setting(4, "dflash")


def test_the_sidecar_baseline_is_the_earlier_sweeps_step_cost_and_acceptance(
    tmp_path: Path,
) -> None:
    write_sweep(tmp_path / "earlier", {0: 1.0, 2: 2.4, 4: 3.1})
    baseline = sidecar_baseline(tmp_path / "earlier", K4, "m")
    assert baseline.num_speculative_tokens == 4 and baseline.step_cost is not None
    assert baseline.mean_acceptance_length == pytest.approx(3.1)
    assert baseline.step_cost.points == 6 and baseline.step_cost.fit_error_rms < 1e-6


@pytest.mark.parametrize(
    ("watched", "model", "says"),
    [
        (
            Setting(3, "dflash"),
            "m",
            "it measured off, dflash-k2, dflash-k4, not this sweep's dflash-k3: give the earlier",
        ),
        (Setting(4, "ngram"), "m", "not this sweep's ngram-k4"),
        (K4, "paying", "measured on model 'm'; this sweep serves 'paying' (--models)"),
    ],
)
def test_an_earlier_sweep_that_does_not_fit_is_refused_by_name(
    tmp_path: Path, watched: Setting, model: str, says: str
) -> None:
    write_sweep(tmp_path / "earlier", {0: 1.0, 2: 2.4, 4: 3.1})
    with pytest.raises(UserError, match=r"^--step-cost-from ") as raised:
        sidecar_baseline(tmp_path / "earlier", watched, model)
    assert says in str(raised.value)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--step-cost-from", "nowhere"], "nowhere: not a finished sweep"),
        (["--step-cost-from", "nowhere", "--k", "0"], "a sweep needs at least two settings"),
        (
            ["--step-cost-from", "nowhere", "--deployer", "helm", "--release", "r"],
            "--step-cost-from reads the local stack's sidecar: it is for --deployer local",
        ),
    ],
)
def test_the_flag_is_checked_before_any_setting_runs(
    tmp_path: Path, extra: list[str], says: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dflash_ops.cli", "bench", "sweep", "--out", str(tmp_path / "o"),
         "--state-dir", str(tmp_path / "stack"), "--temperature", "0", *extra],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "stack" / "state.json").exists()


def answer(
    per_position: list[float], batch: dict[int, int], busy: tuple[float | None, int] = (None, 0)
) -> dict[str, object]:
    """What GET /recommendation?window=1m answers, from the sidecar's own code."""
    advice = recommend(MODEL, per_position, 1000.0, 4, batch, "1m", "greedy; w", busy=busy)
    return advice.model_dump(mode="json")


class Sidecar(http.server.BaseHTTPRequestHandler):
    answers: ClassVar[list[dict[str, object]]] = []
    asked: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        Sidecar.asked.append(self.path)
        body = json.dumps(Sidecar.answers[min(len(Sidecar.asked), len(Sidecar.answers)) - 1])
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def sidecar() -> Iterator[str]:
    Sidecar.asked = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sidecar)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


class WatchedDeployer:
    """Serves every setting from one fake server; the sidecar of k 4 is watched."""

    def __init__(self, base_url: str, sidecar: str) -> None:
        self.base_url, self.sidecar = base_url, sidecar

    def apply(self, setting: Setting) -> str:
        return self.base_url

    def finish(self) -> None:
        pass

    def live_sidecar(self, setting: Setting) -> str | None:
        return self.sidecar if setting.k == 4 and setting.schedule is None else None


def sweep_watching(sidecar: str, server: str, out: Path) -> None:
    """off and k 4 at concurrency 1 and 2 on the fake server, k 4's sidecar watched, then the
    schedule it recommends (--schedule sidecar)."""
    plan = SweepPlan(
        settings=[Setting(0, "dflash"), K4],
        levels=[Level(concurrency=1), Level(concurrency=2)],
        bench=SETTINGS,
        deployer="local",
        schedule="sidecar",
    )
    run_sweep(out, plan, WatchedDeployer(server, sidecar), None, None, None)


WHOLE_RUN = answer([0.5, 0.3, 0.1, 0.05], {1: 40, 200: 2})  # 1-1:4,2-3:3,4-17:2,18-:1


def test_the_watched_setting_asks_its_sidecar_at_every_level_and_its_schedule_is_verified(
    instant_server: str, sidecar: str, tmp_path: Path
) -> None:
    """k 4's sidecar is asked for its 1m window at the end of each level and for its whole run
    after the last; --schedule sidecar then runs that recommendation as one more setting."""
    Sidecar.answers = [
        answer([0.8, 0.6, 0.4, 0.3], {1: 40}), answer([0.7, 0.5, 0.3, 0.2], {8: 40}), WHOLE_RUN
    ]  # fmt: skip
    sweep_watching(sidecar, instant_server, tmp_path)
    # k 4's two levels and its whole run; neither off nor the schedule's run is watched.
    assert Sidecar.asked == ["/recommendation?window=1m"] * 2 + ["/recommendation"]
    kept = live_predictions.load(tmp_path / "points" / K4.key / live_predictions.FILENAME)
    assert list(kept) == ["concurrency 1", "concurrency 2"]
    assert kept["concurrency 2"].recommendation["evidence"]["batch_samples"] == {"8": 40}
    analysis = json.loads((tmp_path / "sweep-results.json").read_text())
    # The fake server's levels last well under the window: no prediction, and why.
    live = analysis["live_predictions"]
    assert live["watched"] == K4.key and live["rows"] == []
    assert live["notes"][0].startswith("concurrency 1: no prediction (the level ran 0 s, under")
    assert "The sidecar's live prediction" in (tmp_path / "sweep.md").read_text()
    verdict = analysis["schedule"]
    assert verdict["schedule"] == WHOLE_RUN["schedule"] and len(verdict["levels"]) == 2
    assert analysis["schedule_derivation"].startswith(
        "recommended by the sidecar of dflash-k4 over its 1m window of the whole run: predicted"
    )


def test_a_static_recommendation_is_not_run_again(
    instant_server: str, sidecar: str, tmp_path: Path
) -> None:
    still = answer([0.8, 0.6, 0.4, 0.3], {1: 40})  # k 4 everywhere: what runs
    Sidecar.answers = [still, still, still]
    sweep_watching(sidecar, instant_server, tmp_path)
    analysis = json.loads((tmp_path / "sweep-results.json").read_text())
    assert analysis["schedule"] is None
    assert analysis["schedule_note"].startswith(
        "the sidecar of dflash-k4: it recommends static k 4"
    )


def test_schedule_sidecar_needs_a_step_cost(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dflash_ops.cli", "bench", "sweep", "--out", str(tmp_path / "o"),
         "--schedule", "sidecar", "--temperature", "0"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--schedule sidecar verifies the sidecar's recommendation: give --step-cost-from" in (
        done.stderr
    )


def test_a_sidecar_that_does_not_answer_leaves_a_note(tmp_path: Path) -> None:
    from dflash_ops.loopback import free_port

    record_level(f"http://127.0.0.1:{free_port()}", tmp_path, level(1, 10, 1, 30, []))
    kept = live_predictions.load(tmp_path / live_predictions.FILENAME)
    note = kept["concurrency 1"].recommendation
    assert note["available"] is False and "failed" in str(note["reason"])


def kept_level(label: str, seconds: float, recommendation: dict[str, object]) -> LevelPrediction:
    return LevelPrediction(level=label, level_seconds=seconds, recommendation=recommendation)


def test_each_prediction_is_set_against_the_static_setting_at_its_k() -> None:
    results = {
        Setting(0, "dflash"): result(level(1, 30, 1, 30, []), level(16, 250, 3, 60, [])),
        Setting(2, "dflash"): result(
            level(1, 53, 1, 20, [0.8, 0.6]), level(16, 210, 4, 70, [0.8, 0.6])
        ),
        K4: result(
            level(1, 58, 1, 18, [0.8, 0.6, 0.4, 0.3]), level(16, 180, 4, 90, [0.8, 0.6, 0.4, 0.3])
        ),
    }
    # k 4 alone ran 0.9 requests on average: the step cost fed that and the measured acceptance.
    results[K4].levels[0].running_batch = RunningBatch(mean=0.9, p50=1, p90=1, max=1, samples=30)
    low = answer([0.8, 0.6, 0.4, 0.3], {1: 60}, busy=(60.0, 60))
    short = {"available": False, "reason": "12 drafts in the 1m window"}
    kept = {
        "concurrency 1": kept_level("concurrency 1", 64, low),
        "concurrency 16": kept_level("concurrency 16", 64, short),
    }
    comparison = compare(K4, kept, results)
    by_k = low["predicted_tokens_per_s_by_k"]
    assert isinstance(by_k, dict)
    # k 1 and 3 were not measured: no row for them.
    assert [(r.level, r.k) for r in comparison.rows] == [("concurrency 1", k) for k in (0, 2, 4)]
    for row in comparison.rows:
        measured = {0: 30.0, 2: 53.0, 4: 58.0}[row.k]
        assert row.measured_tokens_per_s == measured
        assert row.error == pytest.approx(by_k[str(row.k)] / measured - 1)
    assert comparison.largest_error == max(abs(r.error) for r in comparison.rows)
    own = 0.9 * 3.1 / MODEL.step_seconds(0.9, 4)  # mean acceptance length 1 + 2.1
    assert [r.from_sweep_error for r in comparison.rows] == [
        None, None, pytest.approx(own / 58.0 - 1),
    ]  # fmt: skip
    assert comparison.notes == ["concurrency 16: no prediction (12 drafts in the 1m window)"]
    assert comparison.measured_on == "greedy; w"
    text = table(comparison)
    assert f"Largest error {comparison.largest_error:.1%}." in text
    assert "| concurrency 1 | 4 |" in text and "- concurrency 16: no prediction" in text
    assert f"| {own / 58.0 - 1:+.1%} |" in text and "| n/a |" in text
    # The engine ran 60 tok/s, far from what the step cost predicts for k 4 alone: the sidecar
    # scaled its predictions to it, and the table says so beside the unscaled error.
    evidence = low["evidence"]
    assert isinstance(evidence, dict) and evidence["scaled"] is True
    ratio = evidence["step_cost_ratio"]
    assert isinstance(ratio, float) and abs(ratio - 1) > 0.25
    assert by_k["4"] == pytest.approx(60.0)
    assert [r.step_cost_ratio for r in comparison.rows] == [ratio] * 3
    assert f"| {ratio:.2f}x, scaled |" in text
    k4 = comparison.rows[-1]
    assert k4.unscaled_error == pytest.approx(by_k["4"] / ratio / 58.0 - 1)
    assert f"| {k4.unscaled_error:+.1%} |" in text


def test_a_level_shorter_than_the_window_gives_no_figure() -> None:
    results = {K4: result(level(1, 58, 1, 18, [0.8, 0.6, 0.4, 0.3]))}
    low = answer([0.8, 0.6, 0.4, 0.3], {1: 60})
    at_59 = {
        "concurrency 1": LevelPrediction(
            level="concurrency 1", level_seconds=59, recommendation=low
        )
    }
    at_60 = {
        "concurrency 1": LevelPrediction(
            level="concurrency 1", level_seconds=60, recommendation=low
        )
    }
    assert compare(K4, at_59, results).rows == []
    assert [r.k for r in compare(K4, at_60, results).rows] == [4]


def test_the_local_deployer_watches_the_static_setting_at_the_baselines_k(tmp_path: Path) -> None:
    """Only the static setting at the baseline's k gets it; its sidecar, as the stack starts it,
    scrapes every second with the step cost (read back by the sidecar's own settings)."""
    import yaml
    from dflash_ops.bench.sweep.deployers import LocalDeployer
    from dflash_ops.cli import build_parser
    from dflash_ops.cli.sidecar import settings_from
    from dflash_ops.local import stack

    write_sweep(tmp_path / "earlier", {0: 1.0, 2: 2.4, 4: 3.1})
    path = tmp_path / "sidecar-baseline.yaml"
    baseline = sidecar_baseline(tmp_path / "earlier", Setting(4, "dflash"), "m")
    path.write_text(yaml.safe_dump(baseline.model_dump(mode="json")))
    watched = Setting(4, "draft_model")
    deployer = LocalDeployer(tmp_path / ".sweep-stack", 18000, 19000, sidecar=(path, watched))
    try:
        assert deployer.live_sidecar(Setting(4, "draft_model")) == "http://127.0.0.1:19000"
        assert deployer.live_sidecar(Setting(4, "ngram")) is None
        assert deployer.live_sidecar(Setting(2, "draft_model")) is None
        assert deployer.live_sidecar(Setting(4, "draft_model", ((1, 1, 4), (2, 65536, 2)))) is None
        assert deployer.live_sidecar(Setting(0, "draft_model")) is None
    finally:
        deployer.finish()
    config = stack.StackConfig(
        state_dir=tmp_path, prometheus=False, sidecar_scrape_interval=1.0, baseline=path
    )
    (sidecar,) = [c for c in stack._components(config) if c.name == "sidecar"]
    argv = sidecar.argv[sidecar.argv.index("sidecar") :]
    stack.baseline_path(config).write_text(path.read_text())  # what `up` writes first
    settings = settings_from(build_parser().parse_args(argv), {})
    assert settings.scrape_interval == 1.0 and settings.baseline is not None
    assert settings.baseline.step_cost == baseline.step_cost
    plain = stack.StackConfig(state_dir=tmp_path, prometheus=False)
    (sidecar,) = [c for c in stack._components(plain) if c.name == "sidecar"]
    assert "--scrape-interval" not in sidecar.argv
