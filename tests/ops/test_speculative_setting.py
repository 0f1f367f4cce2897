"""The one speculative setting (dflash_ops.speculative_setting): its renderings agree with each
other and with what the chart makes of them, and a schedule's text is read once per process
wherever it enters (local up, the sweep)."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml
from dflash_ops import speculative_schedule, speculative_setting
from dflash_ops.chart.helm import engine_args_in_render, helm_binary
from dflash_ops.paths import CHART_DIR
from dflash_ops.speculative_config import speculative_config_args
from dflash_ops.speculative_schedule import ScheduleError, parse_schedule
from dflash_ops.speculative_setting import ScheduleValue, SpeculativeSetting
from pydantic import BaseModel, ValidationError

DRAFT = "z-lab/Qwen3.8-Flash-Next-DFlash2"
SETTINGS = [
    SpeculativeSetting(0, "dflash"),
    SpeculativeSetting(4, "off"),
    SpeculativeSetting(4, "dflash"),
    SpeculativeSetting(3, "mtp"),
    SpeculativeSetting(7, "dflash", parse_schedule("1-2:7,3-16:3,17-:0", 7)),
    SpeculativeSetting(2, "ngram"),
]


def chart_args(*args: str) -> list[str]:
    done = subprocess.run(
        [helm_binary(), "template", "r", str(CHART_DIR), *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-1500:]
    return engine_args_in_render(done.stdout)


def rendered_config(args: list[str]) -> dict[str, object] | None:
    if "--speculative-config" not in args:
        return None
    loaded: dict[str, object] = json.loads(args[args.index("--speculative-config") + 1])
    return loaded


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: f"{s.key}-{s.k}")
def test_the_chart_serves_what_the_engine_arguments_say(setting: SpeculativeSetting) -> None:
    """chart_values (a values file) and helm_sets (what the sweep's helm upgrade passes) render
    the --speculative-config engine_args gives, with the chart's draft for dflash."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as values:
        values.write(yaml.safe_dump({"speculative": setting.chart_values(DRAFT)}))
        values.flush()
        from_values = rendered_config(chart_args("-f", values.name))
    from_sets = rendered_config(chart_args(*setting.helm_sets(), "--set",
                                           f"speculative.draftModel={DRAFT}"))  # fmt: skip
    draft = DRAFT if setting.method == "dflash" else None
    expected = rendered_config(setting.engine_args(draft))
    assert from_values == from_sets == expected
    assert setting.engine_args(draft) == (
        speculative_config_args(setting.method, setting.k, draft, setting.schedule)
        if setting.speculating
        else []
    )


def test_a_schedule_drafts_at_most_k_and_needs_speculation() -> None:
    schedule = parse_schedule("1-2:7,3-:3", 7)
    with pytest.raises(ScheduleError, match="range 1-2 drafts 7: k must be 0"):
        SpeculativeSetting(4, "dflash", schedule)
    with pytest.raises(ScheduleError, match="needs speculative decoding on"):
        SpeculativeSetting(0, "dflash", schedule)
    with pytest.raises(ValueError, match="k 16 is not 0"):
        SpeculativeSetting(16, "dflash")


def test_settings_sort_and_name_as_the_sweep_lists_them() -> None:
    scheduled = SpeculativeSetting(4, "dflash", parse_schedule("1-2:4,3-:2", 4))
    static = SpeculativeSetting(4, "dflash")
    assert sorted([scheduled, static, SpeculativeSetting(0, "dflash")]) == [
        SpeculativeSetting(0, "dflash"), static, scheduled,
    ]  # fmt: skip
    assert [s.key for s in (scheduled, static, SpeculativeSetting(0, "mtp"))] == [
        "dflash-schedule", "dflash-k4", "off",
    ]  # fmt: skip


class Holder(BaseModel):
    schedule: ScheduleValue = None


def test_a_schedule_field_reads_text_or_lists_once_and_writes_the_short_form() -> None:
    expected = ((1, 2, 4), (3, 65536, 1))
    for given in ("1-2:4;3-:1", "[[1, 2, 4], [3, 65536, 1]]", [[1, 2, 4], [3, 65536, 1]]):
        held = Holder(schedule=given)
        assert held.schedule == expected
        assert held.model_dump(mode="json") == {"schedule": "1-2:4,3-:1"}
        assert Holder.model_validate_json(held.model_dump_json()) == held
    assert Holder(schedule="").schedule is None  # a sweep state written before: "" for none
    assert Holder().model_dump(mode="json") == {"schedule": None}
    with pytest.raises(ValidationError, match="is not FIRST-LAST:K"):
        Holder(schedule="fast")


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every schedule text read, wherever it is read."""
    seen: list[str] = []
    real = speculative_schedule.parse_schedule

    def counted(text: str, max_k: int) -> speculative_schedule.Schedule:
        seen.append(text)
        return real(text, max_k)

    monkeypatch.setattr(speculative_schedule, "parse_schedule", counted)
    monkeypatch.setattr(speculative_setting, "parse_schedule", counted)
    return seen


def test_local_up_reads_the_schedule_once(parses: list[str], tmp_path: Path) -> None:
    from dflash_ops.cli import build_parser
    from dflash_ops.local.engine import engine_argv
    from dflash_ops.local.stack_config import StackConfig

    args = build_parser().parse_args(
        ["local", "up", "--state-dir", str(tmp_path), "--k", "4", "--schedule", "1-2:4,3-:1"]
    )
    config = StackConfig(state_dir=tmp_path, num_speculative_tokens=4, schedule=args.schedule)
    argv = engine_argv(config)
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 2, 4], [3, 65536, 1]]
    assert parses == ["1-2:4,3-:1"]


def test_the_sweep_reads_the_schedule_once(parses: list[str]) -> None:
    """From the flag to the plan, the state written and read back, and the setting run."""
    from dflash_ops.bench.sweep.run import SweepPlan, SweepState, schedule_setting
    from dflash_ops.cli import build_parser
    from dflash_ops.cli.bench.flags import bench_settings, load_levels
    from dflash_ops.cli.bench.sweep import settings_of

    args = build_parser().parse_args(
        ["bench", "sweep", "--deployer", "helm", "--base-url", "http://127.0.0.1:9",
         "--k", "0,4", "--method", "dflash", "--concurrency", "1,8", "--temperature", "0",
         "--schedule", "1-2:4,3-:1"]
    )  # fmt: skip
    plan = SweepPlan(
        settings=settings_of(args),
        levels=load_levels(args),
        bench=bench_settings(args),
        deployer=args.deployer,
        schedule=args.schedule,
    )
    state = SweepState(plan=plan)
    setting = schedule_setting(Path("/nonexistent"), plan, state)
    assert setting == SpeculativeSetting(4, "dflash", ((1, 2, 4), (3, 65536, 1)))
    assert parses == ["1-2:4,3-:1"]
    # A resumed sweep reads its state file: each schedule in it is read once, as it enters.
    assert SweepState.model_validate_json(state.model_dump_json()) == state
    assert len(parses) == 3
