"""k-by-batch-size schedules (dflash_ops.speculative_schedule): the short form and vLLM's JSON,
refused by name where vLLM 0.33.0 would refuse them or clamp a k, the same in the chart
(`dflash-serve.speculativeSchedule`), and the k at each batch size exactly vLLM 0.33.0's own
lookup table (vllm/v1/spec_decode/dynamic/utils.py, run in .venv-vllm033)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from dflash_ops.chart.helm import engine_args_in_render, helm_binary
from dflash_ops.paths import CHART_DIR, REPO_ROOT
from dflash_ops.speculative_config import speculative_config
from dflash_ops.speculative_schedule import (
    OPEN_END,
    ScheduleError,
    check_schedule,
    k_at,
    parse_schedule,
    short_form,
)
from hypothesis import given, settings
from hypothesis import strategies as st

REFERENCE = ((1, 4, 7), (5, 16, 3), (17, OPEN_END, 0))


@pytest.mark.parametrize(
    "text",
    [
        "1-4:7,5-16:3,17-:0",
        "1-4:7;5-16:3;17-:0",
        " 1-4:7 5-16:3  17-:0 ",
        "[[1, 4, 7], [5, 16, 3], [17, 65536, 0]]",
    ],
)
def test_the_short_form_and_vllms_json_read_the_same(text: str) -> None:
    assert parse_schedule(text, 7) == REFERENCE
    assert short_form(REFERENCE) == "1-4:7,5-16:3,17-:0"


BAD = {
    "empty": ("", "schedule is empty"),
    "garbage": ("fast please", "entry 'fast' is not FIRST-LAST:K"),
    "negative k": ("1-4:-1", "entry '1-4:-1' is not FIRST-LAST:K"),
    "k above the maximum": ("1-4:8", "range 1-4 drafts 8: k must be 0 (plain decoding) to"),
    "first not 1": ("2-4:3", "starts at batch size 2: the first range starts at 1"),
    "overlap": ("1-4:3,4-8:1", "range 4-8 starts at or before the end of 1-4"),
    "descending": ("5-8:1,1-4:3", "range 1-4 starts at or before the end of 5-8"),
    "empty range": ("1-4:3,9-5:1", "range 9-5 is empty or not positive"),
    "zero": ("0-4:3", "range 0-4 is empty or not positive"),
    "json syntax": ("[[1, 4, 7]", "is not a JSON list"),
    "json entry": ("[[1, 4]]", "entry [1, 4] is not [first, last, k]"),
    "json fraction": ("[[1, 4.5, 2]]", "entry [1, 4.5, 2] is not [first, last, k]"),
    "json not a list": ('{"1": 4}', "must be a non-empty list of ranges"),
}


@pytest.mark.parametrize(("text", "says"), BAD.values(), ids=BAD.keys())
def test_a_bad_schedule_is_one_line_naming_the_value_and_the_fix(text: str, says: str) -> None:
    with pytest.raises(ScheduleError) as refused:
        parse_schedule(text, 7)
    message = str(refused.value)
    assert says in message and "\n" not in message, message


@given(st.text(max_size=60))
@settings(max_examples=300, deadline=None)
def test_any_text_is_a_schedule_or_a_schedule_error(text: str) -> None:
    try:
        schedule = parse_schedule(text, 15)
    except ScheduleError:
        return
    assert schedule[0][0] == 1 and all(0 <= k <= 15 for _, _, k in schedule)


# -- the chart applies the same rules ---------------------------------------------------------


def chart_render(
    schedule: str, *sets: str, set_string: bool = False
) -> tuple[list[str] | None, str]:
    """The engine arguments the chart renders with `schedule` (from a values file, or given with
    --set-string as a user types it), or None and helm's error."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as values:
        values.write(yaml.safe_dump({"speculative": {"schedule": schedule}}))
        values.flush()
        given = ["--set-string", f"speculative.schedule={schedule}"] if set_string else []
        done = subprocess.run(
            [helm_binary(), "template", "r", str(CHART_DIR), "-f", values.name, *given,
             *(arg for item in sets for arg in ("--set", item))],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
    if done.returncode != 0:
        return None, done.stderr
    return engine_args_in_render(done.stdout), ""


@pytest.mark.parametrize(
    ("text", "set_string"),
    [("1-4:7;5-16:3;17-:0", True), ("1-4:7,5-16:3,17-:0", False), ("1-2:4", True),
     ("[[1,2,4],[3,64,1]]", False)],
)  # fmt: skip
def test_the_chart_renders_what_the_python_builder_makes(text: str, set_string: bool) -> None:
    args, error = chart_render(text, set_string=set_string)
    assert args is not None, error
    rendered = json.loads(args[args.index("--speculative-config") + 1])
    draft = rendered["model"]
    assert rendered == speculative_config("dflash", 7, draft, parse_schedule(text, 7))


@pytest.mark.parametrize(
    ("text", "says"),
    [v for k, v in BAD.items() if k not in ("empty",)],
    ids=[k for k in BAD if k != "empty"],
)
def test_the_chart_refuses_what_the_cli_refuses(text: str, says: str) -> None:
    args, error = chart_render(text)
    assert args is None, f"the chart rendered {text!r}"
    line = next(line for line in error.splitlines() if line.startswith("Error:"))
    assert "speculative.schedule" in line and (
        "e.g." in line
        or "give" in line
        or "k must" in line
        or "starts at" in line
        or "write" in line
    ), line


def test_the_chart_refuses_a_schedule_it_cannot_honour() -> None:
    _, off = chart_render("1-4:3", "speculative.method=off")
    assert "is set but speculative.method is off" in off
    data = ["distributed.enabled=true", "distributed.layout=data", "distributed.nodes=2",
            "distributed.gpusPerNode=2", "distributed.dataParallelSize=2"]  # fmt: skip
    _, dp = chart_render("1-4:3", *data)
    assert "vLLM 0.33.0 turns a k schedule off with data parallelism" in dp, dp


# -- vLLM 0.33.0's own rules and lookup -------------------------------------------------------

VLLM_LOOKUP = """
import json, sys
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup
out = []
for entries, max_batch, max_k in json.loads(sys.stdin.read()):
    try:
        out.append(build_dynamic_sd_schedule_lookup(entries, max_batch, max_k))
    except ValueError as err:
        out.append(str(err))
print(json.dumps(out))
"""


def vllm_lookups(cases: list[tuple[list[list[int]], int, int]]) -> list[list[int] | str]:
    done = subprocess.run(
        [str(REPO_ROOT / ".venv-vllm033" / "bin" / "python"), "-c", VLLM_LOOKUP],
        input=json.dumps(cases), capture_output=True, text=True, timeout=300,
        env=os.environ | {"VLLM_TARGET_DEVICE": "cpu"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.skipif(
    not (REPO_ROOT / ".venv-vllm033" / "bin" / "python").exists(),
    reason="needs .venv-vllm033 (make setup) for vLLM 0.33.0's own schedule code",
)
def test_k_at_each_batch_size_is_vllms_own_lookup() -> None:
    import random

    rng = random.Random(0)
    cases: list[tuple[list[list[int]], int, int]] = []
    for _ in range(400):
        entries, start = [], 1 if rng.random() < 0.9 else 2
        for _ in range(rng.randint(1, 4)):
            first = start + (rng.randint(0, 3) if entries and rng.random() < 0.3 else 0)
            last = first + rng.randint(0, 20)
            entries.append([first, last, rng.randint(0, 9)])
            start = last + 1 if rng.random() < 0.8 else max(1, last - 1)  # some overlap
        cases.append((entries, rng.randint(1, 80), rng.randint(1, 9)))
    accepted = 0
    for (entries, max_batch, max_k), theirs in zip(cases, vllm_lookups(cases), strict=True):
        try:
            ours = check_schedule(entries, 15)
        except ScheduleError:
            assert isinstance(theirs, str), (entries, theirs)  # vLLM refuses it too
            continue
        assert isinstance(theirs, list), (entries, theirs)
        accepted += 1
        assert [k_at(ours, b, max_k) for b in range(1, max_batch + 1)] == theirs[1:], entries
    assert accepted > 100


def test_local_up_refuses_a_bad_schedule_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dflash_ops.cli", "local", "up", "--state-dir", str(tmp_path),
         "--k", "4", "--schedule", "1-2:4,3-:5"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "range 3-65536 drafts 5" in lines[0], done.stderr
    assert not (tmp_path / "state.json").exists()
