"""The sidecar's schedule recommendation: its refusals at each boundary, the gain threshold, the
chart values it hands out, and that it moves when the live traffic changes (acceptance, running
batch), read through the monitor from vLLM expositions, served at GET /recommendation and
exported as dflash_schedule_* series."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from dflash_sidecar import recommendation as rec
from dflash_sidecar.acceptance_window import Delta
from dflash_sidecar.engine_monitor import EngineMonitor
from dflash_sidecar.recommendation import RunningBatchSamples, recommend
from dflash_sidecar.step_cost import StepCostModel

from tests.service.test_app import fast_settings

# Verifying a draft token costs what decoding a request does: at a large batch drafting loses.
MODEL = StepCostModel(
    base_s=0.020, per_request_s=0.0005, per_draft_token_s=0.0005, drafting_s=0.006,
    fit_error_rms=0.02, fit_error_max=0.05, points=12, max_batch=64,
)  # fmt: skip
GOOD = [0.9, 0.8, 0.7, 0.6]
BATCH_1 = {1: 40}


def advise(**overrides: object) -> rec.Recommendation:
    args: dict[str, object] = {
        "step_cost": MODEL, "per_position": GOOD, "drafts": 1000.0, "largest_k": 4,
        "batch_samples": BATCH_1, "window": "15m",
    }  # fmt: skip
    args.update(overrides)
    return recommend(**args)  # type: ignore[arg-type]


def baseline_file(tmp_path: Path, **extra: object) -> str:
    """A baseline at k 4 with GOOD acceptance and MODEL's step cost, as bench sweep writes it."""
    baseline = {
        "model": "m", "num_speculative_tokens": 4, "mean_acceptance_length": 4.0,
        "per_position_acceptance": GOOD, "sampling": "s", "step_cost": MODEL.model_dump(),
        **extra,
    }  # fmt: skip
    path = tmp_path / "baseline.yaml"
    path.write_text(yaml.safe_dump(baseline))
    return str(path)


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"step_cost": None}, "no step-cost model: give the sidecar bench sweep's baseline"),
        ({"largest_k": 0}, "speculation is off"),
        ({"drafts": rec.MIN_DRAFTS - 1}, "199 drafts in the 15m window; waiting for 200"),
        ({"per_position": [0.9]}, "known up to position 1 of 4: a schedule lowered k"),
        ({"batch_samples": {1: rec.MIN_BATCH_SAMPLES - 1}}, "29 scrapes with requests running"),
    ],
)
def test_no_recommendation_says_why(overrides: dict[str, object], says: str) -> None:
    advice = advise(**overrides)
    assert not advice.available and not advice.recommended and says in advice.reason
    assert advice.schedule is None and advice.predicted_gain is None
    assert advice.evidence.window == "15m"


def test_what_already_runs_is_not_recommended_again() -> None:
    # Good acceptance at batch 1: k 4 everywhere it ran, which is what runs.
    advice = advise()
    assert advice.available and advice.predicted_gain == pytest.approx(0.0)
    assert not advice.recommended and "below the 5% a change needs" in advice.reason
    assert advice.running == "1-:4"


def test_poor_acceptance_recommends_off_with_its_chart_values() -> None:
    advice = advise(per_position=[0.05, 0.0, 0.0, 0.0], batch_samples={8: 50})
    assert advice.schedule == "1-:0" and advice.recommended
    assert advice.chart_values == {"speculative": {"method": "off"}}
    assert advice.reason.endswith(
        "off's throughput is the step cost's alone (a speculating engine never runs it, so no "
        "live figure checks it): verify with bench sweep before turning it off"
    )
    assert "step cost's alone" not in advise().reason  # k 4 is what runs: seen live
    assert advice.predicted_gain is not None and advice.predicted_gain > rec.MIN_GAIN
    assert advice.predicted_tokens_per_s is not None
    assert advice.predicted_tokens_per_s["recommended"] > advice.predicted_tokens_per_s["running"]


def test_the_gain_threshold_is_inclusive(monkeypatch: pytest.MonkeyPatch) -> None:
    advice = advise(per_position=[0.05, 0.0, 0.0, 0.0], batch_samples={8: 50})
    assert advice.predicted_gain is not None
    monkeypatch.setattr(rec, "MIN_GAIN", advice.predicted_gain)
    assert advise(per_position=[0.05, 0.0, 0.0, 0.0], batch_samples={8: 50}).recommended
    monkeypatch.setattr(rec, "MIN_GAIN", advice.predicted_gain * (1 + 1e-9))
    assert not advise(per_position=[0.05, 0.0, 0.0, 0.0], batch_samples={8: 50}).recommended


def test_a_schedule_is_handed_out_as_chart_values() -> None:
    # Large batches make the verification tokens dear: k falls as the batch grows.
    advice = advise(batch_samples={1: 20, 200: 20})
    assert advice.schedule is not None and "," in advice.schedule
    speculative = advice.chart_values["speculative"]  # type: ignore[index]
    assert speculative["schedule"] == advice.schedule
    assert speculative["numSpeculativeTokens"] == 4


@pytest.mark.parametrize(
    ("batch_samples", "schedule"),
    [
        # Mostly alone: k 4 alone, k 1 (not 0) at 200 running, where off would be fastest.
        ({1: 40, 200: 2}, "1-1:4,2-3:3,4-17:2,18-:1"),
        # As long at 200 as alone: off whole beats every schedule.
        ({1: 40, 200: 40}, "1-:0"),
    ],
)
def test_a_schedule_never_holds_k_0(batch_samples: dict[int, int], schedule: str) -> None:
    """k 0 inside a schedule still runs the draft model (not priced by the step cost): the
    ranges draft 1 or more, and off is recommended whole when it beats them."""
    advice = advise(per_position=[0.5, 0.3, 0.1, 0.05], batch_samples=batch_samples)
    assert advice.schedule == schedule
    assert advice.predicted_tokens_per_s_by_k is not None
    by_k = advice.predicted_tokens_per_s_by_k
    assert MODEL.tokens_per_s(200, 0, [0.5]) > MODEL.tokens_per_s(200, 1, [0.5])  # off wins at 200
    if schedule == "1-:0":
        assert advice.predicted_tokens_per_s == pytest.approx(
            {"running": by_k[4], "recommended": by_k[0]}
        )


def test_every_static_k_is_predicted_at_the_window_batches() -> None:
    """The per-k predictions are the running and recommended figures' own: static k 4 is what
    runs, the best static k is what a one-range recommendation predicts, k 0 drafts nothing."""
    advice = advise(per_position=[0.5, 0.3, 0.1, 0.05], batch_samples={4: 20, 16: 20})
    by_k = advice.predicted_tokens_per_s_by_k
    assert by_k is not None and sorted(by_k) == [0, 1, 2, 3, 4]
    assert advice.predicted_tokens_per_s is not None
    assert by_k[4] == pytest.approx(advice.predicted_tokens_per_s["running"])
    assert max(by_k.values()) <= advice.predicted_tokens_per_s["recommended"] * (1 + 1e-12)
    off = 0.5 * (4 / MODEL.step_seconds(4, 0)) + 0.5 * (16 / MODEL.step_seconds(16, 0))
    assert by_k[0] == pytest.approx(off)
    assert advise(drafts=0.0).predicted_tokens_per_s_by_k is None


def test_a_shorter_window_reads_only_its_own_traffic(tmp_path: Path) -> None:
    """recommendation(window=...) (GET /recommendation?window=): the batch sizes and acceptance
    of that window alone, where the longest still holds the earlier traffic too."""
    path = baseline_file(tmp_path)
    windows = {"40s": 40.0, "1m": 60.0, "5m": 300.0}
    monitor = EngineMonitor(
        fast_settings(baseline_file=path, speculative_tokens=4, windows=windows)
    )
    counters = Counters()
    now = traffic(monitor, counters, 1000, 120, 1, GOOD)
    now = traffic(monitor, counters, now + 1, 50, 16, [0.3, 0.1, 0.0, 0.0])
    short, longest = monitor.recommendation(now, "40s"), monitor.recommendation(now)
    assert set(short.evidence.batch_samples) == {16} and short.evidence.window == "40s"
    assert set(longest.evidence.batch_samples) == {1, 16} and longest.evidence.window == "5m"
    assert short.evidence.per_position_acceptance[0] == pytest.approx(0.3)
    assert longest.evidence.per_position_acceptance[0] > 0.5


def test_running_batches_are_kept_for_the_longest_window() -> None:
    batches = RunningBatchSamples(keep_seconds=100)
    for t, running in ((0, 3), (10, 0), (50, 3.4), (120, 8)):
        batches.add(t, running)
    assert batches.share(120, 100) == {3: 1, 8: 1}  # t=0 aged out, idle left out
    assert batches.share(120, 10) == {8: 1}


class Counters:
    """vLLM's cumulative counters, advanced by the traffic of each second."""

    def __init__(self) -> None:
        self.drafts = 0.0
        self.draft_tokens = 0.0
        self.accepted = [0.0] * 4

    def advance(self, drafts: float, per_position: list[float], k: int = 4) -> None:
        """`drafts` drafts of k tokens: positions from k on are not drafted."""
        self.drafts += drafts
        self.draft_tokens += drafts * k
        self.accepted = [
            a + (drafts * p if i < k else 0.0)
            for i, (a, p) in enumerate(zip(self.accepted, per_position, strict=True))
        ]

    def exposition(self, running: int) -> str:
        labels = 'engine="0",model_name="m"'
        accepted = sum(self.accepted)
        lines = [
            f"vllm:num_requests_running{{{labels}}} {running}",
            f"vllm:num_requests_waiting{{{labels}}} 0",
            f"vllm:generation_tokens_total{{{labels}}} {self.drafts + accepted}",
            f"vllm:spec_decode_num_drafts_total{{{labels}}} {self.drafts}",
            f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {self.draft_tokens}",
            f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {accepted}",
            *(
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{i}"}} {a}'
                for i, a in enumerate(self.accepted)
            ),
        ]
        return "\n".join(lines) + "\n"


def traffic(
    monitor: EngineMonitor,
    counters: Counters,
    start: float,
    seconds: int,
    running: int,
    per_position: list[float],
    every: int = 1,
    k: int = 4,
) -> float:
    """`seconds` of scrapes, one `every` seconds, at this running batch, acceptance and k in
    effect (20 drafts a second)."""
    for t in range(0, seconds + 1, every):
        counters.advance(20.0 * every, per_position, k)
        monitor.ingest(counters.exposition(running), start + t)
    return start + seconds


def test_the_recommendation_moves_with_the_traffic(tmp_path: Path) -> None:
    """Through the monitor (GET /recommendation's source), windows of 60 s: good acceptance at
    batch 1 keeps k 4; the draft going bad turns speculation off once the window holds the new
    traffic; a large running batch gives a schedule that drafts less as the batch grows."""
    path = baseline_file(tmp_path, sampling="temperature 1", workload="w")
    settings = fast_settings(baseline_file=path, speculative_tokens=4, windows={"1m": 60.0})
    monitor = EngineMonitor(settings)
    counters = Counters()
    now = traffic(monitor, counters, 1000, 60, 1, GOOD)
    first = monitor.recommendation(now)
    assert first.available and first.schedule == "1-:4" and not first.recommended
    assert first.evidence.step_cost == MODEL and first.evidence.measured_on == "temperature 1; w"
    now = traffic(monitor, counters, now + 1, 30, 1, [0.02, 0.0, 0.0, 0.0])
    # Half the window is the new traffic: the window still reads the old acceptance mostly.
    halfway = monitor.recommendation(now)
    now = traffic(monitor, counters, now + 1, 60, 1, [0.02, 0.0, 0.0, 0.0])
    moved = monitor.recommendation(now)
    assert moved.schedule == "1-:0" and moved.recommended, moved.reason
    # Halfway the window reads a mix of both (it needs a full window to follow the traffic).
    assert 0.1 < halfway.evidence.per_position_acceptance[0] < 0.8
    now = traffic(monitor, counters, now + 1, 61, 200, GOOD)
    busy = monitor.recommendation(now)
    assert busy.schedule is not None and busy.schedule.startswith("1-31:4,") and busy.recommended
    assert busy.schedule.endswith("-:1")  # k 1 at batch 200: verification is dear there
    assert set(busy.evidence.batch_samples) == {200}


def test_served_and_exported(
    before_text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GET /recommendation answers with the reason; /metrics says whether one is available and,
    when it is, the gain and the k per range, in valid exposition."""
    import time

    from dflash_sidecar.app import create_app
    from dflash_sidecar.metrics import build_registry
    from fastapi.testclient import TestClient
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from tests.service.fake_engine import FakeEngine
    from tests.service.test_app import wait_for

    engine = FakeEngine(before_text)
    settings = fast_settings()
    monitor = EngineMonitor(settings, client=engine.client())
    with TestClient(create_app(settings, monitor)) as client:
        wait_for(lambda: client.get("/readyz").status_code == 200)
        answer = client.get("/recommendation").json()
        assert answer["available"] is False and "no step-cost model" in answer["reason"]
        assert client.get("/recommendation?window=1m").json()["evidence"]["window"] == "1m"
        wrong = client.get("/recommendation?window=7m")
        assert wrong.status_code == 400
        assert wrong.json()["detail"] == (
            "window='7m' is not one of the sidecar's windows: use " + ", ".join(settings.windows)
        )
        body = client.get("/metrics").text
    assert "dflash_schedule_recommendation_available 0.0" in body
    assert "dflash_schedule_predicted_gain" not in body
    list(text_string_to_metric_families(body))
    # Available: a monitor fed the traffic above.
    path = baseline_file(tmp_path)
    fed = EngineMonitor(
        fast_settings(
            baseline_file=path,
            speculative_tokens=4,
            windows={"1m": 60.0},
            scrape_interval=10.0,  # as the traffic below scrapes
            scrape_timeout=5.0,
        )
    )
    # Scrapes up to a second ago: the collector judges at the real clock.
    monkeypatch.setattr(rec, "MIN_BATCH_SAMPLES", 5)
    traffic(fed, Counters(), time.monotonic() - 60, 60, 200, GOOD, every=10)
    text = generate_latest(build_registry(fed)).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["dflash_schedule_recommendation_available"].samples[0].value == 1.0, (
        fed.recommendation().reason
    )
    gain = families["dflash_schedule_predicted_gain"].samples[0].value
    assert gain == pytest.approx(fed.recommendation().predicted_gain, rel=0.01) and gain > 0.05
    ks = {
        (x.labels["first"], x.labels["last"]): x.value
        for x in families["dflash_schedule_recommended_k"].samples
    }
    assert ks[("1", "31")] == 4.0 and ks[("139", "65536")] == 1.0
    tokens = families["dflash_schedule_predicted_tokens_per_second"].samples
    assert {x.labels["schedule"] for x in tokens} == {"running", "recommended"}
    # The engine's speed against the step cost's prediction for what runs (the traffic's 20
    # drafts a scrape, every 10 s, run far slower than MODEL predicts): scaled to it.
    ratio = families["dflash_schedule_step_cost_ratio"].samples[0].value
    evidence = fed.recommendation().evidence
    assert ratio == pytest.approx(evidence.step_cost_ratio) and evidence.scaled
    running = next(x.value for x in tokens if x.labels["schedule"] == "running")
    assert running == pytest.approx(evidence.measured_tokens_per_s)


def test_the_gain_is_over_the_schedule_that_runs() -> None:
    """Against a running schedule that already stops drafting at large batches, the advice
    for a busy engine gains less than against the static largest k."""
    busy = {200: 40}
    static = advise(batch_samples=busy)
    scheduled = advise(batch_samples=busy, running_schedule=((1, 31, 4), (32, 65536, 1)))
    assert scheduled.running == "1-31:4,32-:1" and static.running == "1-:4"
    assert static.predicted_gain is not None and scheduled.predicted_gain is not None
    assert scheduled.predicted_gain < static.predicted_gain
    assert scheduled.schedule == static.schedule


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[[1, 4, 7], [5, 65536, 3]]", None),
        ("1-4:7", "is not vLLM's JSON list"),
        ("[[2, 4, 3]]", "from batch size 1"),
        ("[[1, 4, 3], [4, 8, 1]]", "ascending"),
        ("[[1, 4, 9]]", "k 0..speculative_tokens (7)"),
        ("[[1, 4]]", "[first, last, k]"),
    ],
)
def test_the_running_schedule_setting_is_read_or_refused_in_one_line(
    text: str, says: str | None
) -> None:
    from pydantic import ValidationError

    if says is None:
        settings = fast_settings(speculative_tokens=7, speculative_schedule=text)
        assert settings.running_schedule() == ((1, 4, 7), (5, 65536, 3))
        return
    with pytest.raises(ValidationError) as refused:
        fast_settings(speculative_tokens=7, speculative_schedule=text)
    message = str(refused.value.errors()[0]["msg"])
    assert says in message and "\n" not in message, message


def test_the_chart_and_the_local_stack_hand_the_schedule_to_the_sidecar(tmp_path: Path) -> None:
    from dflash_ops.chart.helm import helm_template
    from dflash_ops.local import stack

    def sidecar_env(*sets: str) -> dict[str, str]:
        docs = [d for d in yaml.safe_load_all(helm_template([], list(sets), "t", "llm")) if d]
        deployment = next(d for d in docs if d["kind"] == "Deployment")
        (sidecar,) = [
            c for c in deployment["spec"]["template"]["spec"]["containers"]
            if c["name"] == "sidecar"
        ]  # fmt: skip
        return {e["name"]: e.get("value") for e in sidecar["env"]}

    env = sidecar_env("speculative.schedule=1-4:7;5-:3")
    assert env["DFLASH_SIDECAR_SPECULATIVE_SCHEDULE"] == "[[1,4,7],[5,65536,3]]"
    assert "DFLASH_SIDECAR_SPECULATIVE_SCHEDULE" not in sidecar_env()
    # The sidecar reads what the chart renders.
    assert fast_settings(
        speculative_tokens=7, speculative_schedule=env["DFLASH_SIDECAR_SPECULATIVE_SCHEDULE"]
    ).running_schedule() == ((1, 4, 7), (5, 65536, 3))
    config = stack.StackConfig.model_validate(
        {"state_dir": tmp_path, "prometheus": False, "num_speculative_tokens": 4,
         "schedule": "1-2:4,3-:1"}
    )  # fmt: skip
    sidecar = next(c for c in stack._components(config) if c.name.startswith("sidecar"))
    argv = sidecar.argv
    assert argv[argv.index("--speculative-schedule") + 1] == "[[1, 2, 4], [3, 65536, 1]]"


def schedule_monitor(tmp_path: Path) -> EngineMonitor:
    """A sidecar whose engine runs the schedule 1-1:4,2-:2, windows of 60 s and 5 min."""
    path = baseline_file(tmp_path)
    settings = fast_settings(
        baseline_file=path,
        speculative_tokens=4,
        speculative_schedule="[[1, 1, 4], [2, 65536, 2]]",
        windows={"1m": 60.0, "5m": 300.0},
    )
    return EngineMonitor(settings)


def test_under_a_schedule_each_position_counts_the_scrapes_that_reached_it(tmp_path: Path) -> None:
    """A minute alone at k 4, a minute at 8 running and k 2: positions 0-1 from both, 2-3 from
    the k 4 scrapes only, each at its true rate (vLLM's per-position lines past the k in effect
    stay still); the advice is available for the schedule that runs."""
    monitor = schedule_monitor(tmp_path)
    counters = Counters()
    now = traffic(monitor, counters, 1000, 60, 1, GOOD, k=4)
    now = traffic(monitor, counters, now + 1, 60, 8, GOOD, k=2)
    advice = monitor.recommendation(now)
    assert advice.available, advice.reason
    assert advice.evidence.per_position_acceptance == pytest.approx(GOOD)
    reached = advice.evidence.position_drafts
    assert reached is not None and reached[0] == reached[1] > 2 * reached[2] > 0
    assert advice.running == "1-1:4,2-:2"


def test_under_a_schedule_a_position_never_reached_is_said(tmp_path: Path) -> None:
    monitor = schedule_monitor(tmp_path)
    now = traffic(monitor, Counters(), 1000, 90, 8, GOOD, k=2)
    advice = monitor.recommendation(now)
    assert not advice.available
    assert advice.reason.endswith(
        "known up to position 2 of 4: a schedule lowered k in the 5m window (position 3 was "
        "reached by 0 drafts of the scrape intervals that ran one k; 50 needed)"
    ), advice.reason


def test_scrapes_that_mixed_ks_are_left_out() -> None:
    def interval(drafts: float, k_tokens: float, accepted: list[float]) -> Delta:
        return Delta(
            seconds=1, drafts=drafts, draft_tokens=k_tokens, accepted=sum(accepted),
            accepted_per_pos=tuple(accepted), generation_tokens=0, pos_drafts=drafts,
        )  # fmt: skip

    at_4 = [interval(20, 80, [18, 16, 14, 12])] * 3
    at_2 = [interval(40, 80, [36, 32, 0, 0])] * 2
    mixed = interval(20, 50, [18, 16, 5, 4])  # k 2.5 in effect: dropped
    three = interval(20, 60, [18, 16, 14, 0])  # k 3 is not one of the schedule's: dropped
    rates, reached = rec.per_position_at_k_in_effect([*at_4, *at_2, mixed, three], {4, 2})
    assert reached == [140, 140, 60, 60]
    assert rates == pytest.approx([0.9, 0.8, 0.7, 0.6])
    few, _ = rec.per_position_at_k_in_effect(at_4[:2] + at_2, {4, 2})  # 40 drafts reached 2
    assert few == pytest.approx([0.9, 0.8])


def interval(seconds: float, tokens: float) -> Delta:
    return Delta(
        seconds=seconds, drafts=tokens / 4, draft_tokens=tokens, accepted=0.0,
        accepted_per_pos=(), generation_tokens=tokens,
    )  # fmt: skip


def test_busy_throughput_leaves_idle_scrapes_out_and_sums_engines() -> None:
    one = [interval(1.0, 50.0), interval(1.0, 0.0), interval(2.0, 150.0)]
    other = [interval(1.0, 20.0)]
    assert rec.busy_tokens_per_s([one]) == (pytest.approx(200 / 3), 2)
    assert rec.busy_tokens_per_s([one, other]) == (pytest.approx(200 / 3 + 20), 2)
    assert rec.busy_tokens_per_s([[interval(1.0, 0.0)], []]) == (None, 0)


@pytest.mark.parametrize(
    ("ratio", "scaled"), [(0.74, True), (0.76, False), (1.0, False), (1.24, False), (1.26, True)]
)
def test_predictions_are_scaled_only_beyond_the_step_costs_drift(
    ratio: float, scaled: bool
) -> None:
    """Within 25% of the step cost's prediction for what runs, the engine's speed is the step
    cost's own run-to-run variation: the predictions stay the step cost's. Beyond, every
    prediction is scaled by it and the advice says to refit; the gain and the schedule never
    move."""
    plain = advise(batch_samples={200: 40})
    assert plain.predicted_tokens_per_s is not None and plain.predicted_tokens_per_s_by_k
    predicted = plain.predicted_tokens_per_s["running"]
    advice = advise(
        batch_samples={200: 40},
        busy=(ratio * predicted, rec.MIN_BATCH_SAMPLES),
        measured_on="temperature 0",
    )
    assert advice.evidence.step_cost_ratio == pytest.approx(ratio)
    assert advice.evidence.measured_tokens_per_s == pytest.approx(ratio * predicted)
    assert advice.evidence.scaled is scaled
    factor = ratio if scaled else 1.0
    assert advice.predicted_tokens_per_s == pytest.approx(
        {name: factor * v for name, v in plain.predicted_tokens_per_s.items()}
    )
    assert advice.predicted_tokens_per_s_by_k == pytest.approx(
        {k: factor * v for k, v in plain.predicted_tokens_per_s_by_k.items()}
    )
    assert advice.predicted_gain == pytest.approx(plain.predicted_gain)
    assert advice.schedule == plain.schedule
    if scaled:
        assert f"ran at {ratio:.2f}x the step cost's prediction for 1-:4" in advice.reason
        assert "(temperature 0); refit it with bench sweep on this traffic" in advice.reason
    else:
        assert "refit" not in advice.reason


def test_too_few_busy_intervals_judge_no_step_cost() -> None:
    plain = advise()
    assert plain.predicted_tokens_per_s is not None
    few = advise(busy=(0.5 * plain.predicted_tokens_per_s["running"], rec.MIN_BATCH_SAMPLES - 1))
    assert few.evidence.step_cost_ratio is None and not few.evidence.scaled
    assert few.evidence.measured_tokens_per_s is not None
    assert few.predicted_tokens_per_s == plain.predicted_tokens_per_s


def test_the_monitor_judges_the_step_cost_by_the_busy_scrapes_of_its_window(
    tmp_path: Path,
) -> None:
    """Through the monitor: 80 output tokens a second while generating (20 drafts, 3 accepted
    each), however long the engine sat idle in the window; far below what MODEL predicts at
    batch 1, so the predictions are scaled to it."""
    path = baseline_file(tmp_path)
    settings = fast_settings(
        baseline_file=path, speculative_tokens=4, windows={"2m": 120.0}, verdict_window="2m"
    )
    monitor = EngineMonitor(settings)
    counters = Counters()
    now = traffic(monitor, counters, 1000, 40, 1, GOOD)
    for t in range(1, 41):  # idle: nothing running, no counter moves
        monitor.ingest(counters.exposition(0), now + t)
    advice = monitor.recommendation(now + 40)
    assert advice.evidence.measured_tokens_per_s == pytest.approx(20 * (1 + sum(GOOD)))
    expected = MODEL.tokens_per_s(1, 4, GOOD)
    assert advice.evidence.step_cost_ratio == pytest.approx(80 / expected)
    assert advice.evidence.scaled and advice.predicted_tokens_per_s is not None
    assert advice.predicted_tokens_per_s["running"] == pytest.approx(80)
