"""One vocabulary (dflash_ops.vocabulary): the speculative methods, their subsets, the largest k and
the router policies are written there once, and every consumer takes them from it: the chart's
schema and its own checks (asked through helm), the CLI's parsers, and no other source file
spells a list of them or the largest k again."""

from __future__ import annotations

import ast
import json
import re
import subprocess
from pathlib import Path

import pytest
from dflash_ops.chart.helm import helm_binary
from dflash_ops.cli import build_parser
from dflash_ops.paths import CHART_DIR, REPO_ROOT
from dflash_ops.vocabulary import (
    CHART_METHODS,
    LOCAL_METHODS,
    LOCAL_MODELS,
    MAX_K,
    ROUTER_POLICIES,
    SPECULATIVE_METHODS,
    STANDING_ROUTER_POLICIES,
    speculating,
)

VOCABULARY_FILE = REPO_ROOT / "ops" / "dflash_ops" / "vocabulary.py"


def test_the_subsets_are_subsets() -> None:
    assert set(CHART_METHODS) <= set(SPECULATIVE_METHODS)
    assert set(LOCAL_METHODS) <= set(SPECULATIVE_METHODS)
    assert set(STANDING_ROUTER_POLICIES) <= set(ROUTER_POLICIES)
    assert speculating(CHART_METHODS) == ("dflash", "mtp", "ngram")


def test_the_chart_schema_enums_are_the_vocabulary() -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())["properties"]
    speculative = schema["speculative"]["properties"]
    assert speculative["method"]["enum"] == list(CHART_METHODS)
    assert speculative["numSpeculativeTokens"]["maximum"] == MAX_K
    assert schema["router"]["properties"]["policy"]["enum"] == list(STANDING_ROUTER_POLICIES)


def helm_template_error(*sets: str) -> str:
    """What helm prints when the chart refuses, or '' when it renders."""
    done = subprocess.run(
        [helm_binary(), "template", "r", str(CHART_DIR), "--skip-schema-validation",
         *(arg for item in sets for arg in ("--set", item))],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return "" if done.returncode == 0 else done.stderr


def test_the_charts_own_check_reads_the_vocabulary() -> None:
    """Past the schema (--skip-schema-validation), the chart's template check refuses a method
    outside the vocabulary and names the ones it serves, and accepts each of those."""
    error = helm_template_error("speculative.method=eagle")
    expected = f"use {', '.join(CHART_METHODS[:-1])} or {CHART_METHODS[-1]}"
    assert 'speculative.method "eagle" is unknown' in error and expected in error, error
    for method in ("mtp", "ngram", "off"):
        assert helm_template_error(f"speculative.method={method}") == "", method


def accepted(argv: list[str]) -> bool:
    try:
        build_parser().parse_args(argv)
    except SystemExit:
        return False
    return True


@pytest.mark.parametrize(
    ("argv", "words", "everything"),
    [
        (["plan", "--method"], CHART_METHODS, SPECULATIVE_METHODS),
        (["local", "up", "--method"], LOCAL_METHODS, SPECULATIVE_METHODS),
        (["local", "up", "--router-policy"], STANDING_ROUTER_POLICIES, ROUTER_POLICIES),
        (["bench", "sweep", "--method"], SPECULATIVE_METHODS, SPECULATIVE_METHODS),
        (["bench", "router-policies", "--policies"], ROUTER_POLICIES, ROUTER_POLICIES),
        (["local", "up", "--models"], LOCAL_MODELS, LOCAL_MODELS),
        (["bench", "sweep", "--models"], LOCAL_MODELS, LOCAL_MODELS),
    ],
    ids=[
        "plan",
        "local-method",
        "local-router",
        "sweep",
        "router-policies",
        "local-models",
        "sweep-models",
    ],
)
def test_each_cli_choice_is_its_vocabulary(
    argv: list[str], words: tuple[str, ...], everything: tuple[str, ...]
) -> None:
    for word in everything:
        assert accepted([*argv, word]) == (word in words), (argv, word)
    assert not accepted([*argv, "eagle3"])


@pytest.mark.parametrize(
    "argv",
    [["local", "up", "--k"], ["bench", "sweep", "--k"]],
    ids=["local", "sweep"],
)
def test_the_largest_k_is_the_vocabularys(argv: list[str]) -> None:
    assert accepted([*argv, str(MAX_K)]) and not accepted([*argv, str(MAX_K + 1)])


# -- nothing else spells them ----------------------------------------------------------------


def _words_in(node: ast.AST) -> set[str]:
    return {
        e.value for e in ast.walk(node) if isinstance(e, ast.Constant) and isinstance(e.value, str)
    }


def spelled_again(path: Path) -> list[str]:
    """Lists of two or more speculative methods or router policies in `path`, and the largest
    k given as a bound (an argparse number bound, a pydantic le=, a comparison)."""
    found = []
    tree = ast.parse(path.read_text())
    # `method in ("off", "ngram")` is a decision about some methods, not a list of them.
    decisions = {
        id(side)
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn))
        for side in node.comparators
    }
    for node in ast.walk(tree):
        elements: list[ast.expr] = []
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and id(node) not in decisions:
            elements = list(node.elts)
        words = {e.value for e in elements if isinstance(e, ast.Constant)}
        for name, vocabulary in (("methods", SPECULATIVE_METHODS), ("policies", ROUTER_POLICIES)):
            if len(words & set(vocabulary)) >= 2:
                found.append(f"{path.name}:{node.lineno}: a list of {name}")
        bounds: list[ast.expr] = []
        if isinstance(node, ast.Call):
            callee = node.func.id if isinstance(node.func, ast.Name) else ""
            if callee in ("number", "number_list"):
                bounds += node.args
            bounds += [k.value for k in node.keywords if k.arg in ("le", "lt", "high")]
        if isinstance(node, ast.Compare):
            bounds += [node.left, *node.comparators]
        if any(isinstance(b, ast.Constant) and b.value == MAX_K for b in bounds):
            found.append(f"{path.name}:{node.lineno}: the largest k as a literal")
    return found


def test_no_source_spells_the_vocabulary_again() -> None:
    problems = []
    for path in sorted((REPO_ROOT / "ops" / "dflash_ops").rglob("*.py")):
        if path != VOCABULARY_FILE:
            problems += spelled_again(path)
    templates = CHART_DIR / "templates"
    for path in sorted(templates.rglob("*")):
        if path.is_file():
            for match in re.finditer(r"\(list ((?:\"\w+\"\s*)+)\)", path.read_text()):
                if len(set(re.findall(r"\"(\w+)\"", match.group(1))) & set(CHART_METHODS)) >= 2:
                    problems.append(f"{path.name}: {match.group(0)}")
    assert problems == []


def test_the_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    source = tmp_path / "again.py"
    source.write_text(
        'M = ("dflash", "mtp")\nP = ["round_robin", "random"]\n'
        f"x = number_list(int, 0, {MAX_K})\ny = Field(le={MAX_K})\nz = 1 <= k <= {MAX_K}\n"
        'fine = ("dflash",)\nif method in ("off", "ngram"): pass\n'
    )
    assert len(spelled_again(source)) == 5, spelled_again(source)
