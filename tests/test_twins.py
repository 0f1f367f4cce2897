"""Every pair of Python and Go-template code that must agree, listed in one place.

The chart cannot call Python, so a rule both the CLI and the chart apply is written twice: once
in ops/ and once in a template. Each such pair is a `Twin` here, with the tests that hold the two
to one answer. This module checks the list itself: each Python side and template side exists,
the template's comment names its Python twin (so a reader of either finds the other), every
template helper whose comment names a dflash_ops module is listed, and every listed check is a
test that exists (the checks run where they live, in the suite's other modules). Data both sides
read (the vocabulary, the door's path grammar, the block-size and sidecar tables) is written by
`make generate` from Python, not kept twice: tests/ops/test_generate.py holds it current."""

from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass

import pytest

from tests.conftest import REPO_ROOT

TEMPLATES = REPO_ROOT / "charts" / "dflash-serve" / "templates"


@dataclass(frozen=True)
class Twin:
    rule: str
    module: str  # the Python side: a dflash_ops module ...
    names: tuple[str, ...]  # ... and what in it the template mirrors
    template: str  # the Go side: a file of templates/ ...
    define: str | None  # ... and its helper (None: the whole file)
    checks: tuple[str, ...]  # tests that fail when the two disagree


TWINS = (
    Twin(
        "the k schedule's grammar and refusals",
        "dflash_ops.speculative_schedule", ("parse_schedule", "check_schedule"),
        "_engine.tpl", "dflash-serve.speculativeSchedule",
        ("tests/ops/test_speculative_schedule.py::test_the_chart_renders_what_the_python_builder_makes",
         "tests/ops/test_speculative_schedule.py::test_the_chart_refuses_what_the_cli_refuses",
         "tests/ops/test_speculative_schedule.py::test_the_chart_refuses_a_schedule_it_cannot_honour"),
    ),
    Twin(
        "the engine's --speculative-config for each method and k",
        "dflash_ops.speculative_config", ("speculative_config",),
        "_engine.tpl", "dflash-serve.speculativeConfig",
        ("tests/charts/test_speculative_config.py::test_chart_helper_matches_the_python_builder",
         "tests/ops/test_speculative_setting.py::test_the_chart_serves_what_the_engine_arguments_say"),
    ),
    Twin(
        "the block size for a GPU, TP, KV dtype and k",
        "dflash_ops.plan.closed_form", ("plan_block_size",),
        "_engine.tpl", "dflash-serve.blockSize",
        ("tests/charts/test_block_size.py::test_chart_block_size_equals_the_planner",
         "tests/charts/test_block_size.py::test_fp8_kv_cache_uses_its_own_table"),
    ),
    Twin(
        "the door's files (door.d/: routes, keys, timeouts, drain)",
        "dflash_ops.local.door", ("DoorConfig", "default_shutdown_timeout"),
        "door.yaml", None,
        ("tests/charts/test_door.py::test_the_door_configmap_is_what_the_local_stack_runs",),
    ),
    Twin(
        "how the door matches an allow-list path (case-sensitive, {name} segments)",
        "dflash_ops.local.door", ("map_source",),
        "_door.tpl", "dflash-serve.doorMapSource",
        ("tests/charts/test_door.py::test_the_door_configmap_is_what_the_local_stack_runs",
         "tests/charts/test_door.py::test_what_the_review_found_is_refused_by_name"),
    ),
    Twin(
        "the sidecar's settings: the chart's variables and its refusals",
        "dflash_sidecar.settings", ("SidecarSettings",),
        "_containers.tpl", "dflash-serve.sidecarContainer",
        ("tests/charts/test_sidecar_settings.py::test_every_variable_is_a_setting_named_by_the_rule",
         "tests/charts/test_sidecar_settings.py::test_the_sidecar_accepts_its_container",
         "tests/charts/test_sidecar_settings.py::test_the_chart_refuses_exactly_what_the_sidecar_refuses"),
    ),
)  # fmt: skip

_HELPER = re.compile(
    r"\{\{/\*(?P<comment>(?:(?!\*/\}\}).)*)\*/\}\}\s*\{\{-? define \"(?P<name>[^\"]+)\"", re.S
)
_MODULE = re.compile(r"dflash_(?:ops|sidecar)\.[a-z_]+(?:\.[a-z_]+)*")


def helper_comments() -> dict[tuple[str, str], str]:
    """(template file, helper) -> the comment right above its define."""
    found = {}
    for path in sorted(TEMPLATES.glob("*.tpl")):
        for match in _HELPER.finditer(path.read_text()):
            found[(path.name, match["name"])] = match["comment"]
    return found


def names_module(comment: str, module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in _MODULE.findall(comment))


@pytest.mark.parametrize("twin", TWINS, ids=lambda t: t.rule)
def test_each_twin_has_both_sides_and_names_the_other(twin: Twin) -> None:
    module = importlib.import_module(twin.module)
    missing = [name for name in twin.names if not hasattr(module, name)]
    assert not missing, f"{twin.module} has no {', '.join(missing)}"
    text = (TEMPLATES / twin.template).read_text()
    if twin.define is None:
        head = text[: text.find("*/}}")]
        assert twin.module in head, f"{twin.template}'s first comment does not name {twin.module}"
        return
    comment = helper_comments().get((twin.template, twin.define))
    assert comment is not None, f"{twin.template} has no commented define {twin.define!r}"
    assert twin.module in comment, f"{twin.define}'s comment does not name {twin.module}"


def test_every_template_helper_that_names_a_python_twin_is_listed() -> None:
    listed = {(t.template, t.define) for t in TWINS}
    unlisted = [
        f"{file}: {name} (names {', '.join(_MODULE.findall(comment))})"
        for (file, name), comment in helper_comments().items()
        if _MODULE.search(comment) and (file, name) not in listed
    ]
    assert not unlisted, "list these twins in tests/test_twins.py: " + "; ".join(unlisted)


@pytest.mark.parametrize("check", sorted({c for t in TWINS for c in t.checks}))
def test_each_check_is_a_test_that_exists(check: str) -> None:
    path, name = check.split("::")
    tree = ast.parse((REPO_ROOT / path).read_text())
    tests = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert name in tests, f"{path} has no {name}: the twin's check moved or was renamed"
