"""model.extraArgs cannot set a flag the chart owns however it is spelt: every flag of the
chart's list, in the shortest abbreviation vLLM 0.33.0's own `vllm serve` parser reads as that
flag (argparse's allow_abbrev), and the dotted JSON forms its FlexibleArgumentParser reads
(`--speculative-config.method=...`), is refused by name."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from dflash_ops.chart.helm import helm_template
from dflash_ops.errors import UserError
from dflash_ops.paths import CHART_DIR

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.vllm033

# For each flag: the shortest prefix vLLM's parser resolves to that very flag (None: none
# shorter than the flag), and whether `FLAG.key=value` reaches it.
PROBE = r"""
import json, sys
from vllm.entrypoints.common.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

parser = make_arg_parser(FlexibleArgumentParser())
found = {}
for flag in json.loads(sys.argv[1]):
    action = next(a for a in parser._actions if flag in a.option_strings)
    shortest = None
    for n in range(3, len(flag)):
        try:
            resolved = parser._parse_optional(flag[:n])
        except SystemExit:  # ambiguous: argparse refuses it
            continue
        if resolved and resolved[0] is action:
            shortest = flag[:n]
            break
    dotted = None
    try:
        args = parser.parse_args(["--model", "m", flag + ".method=ngram"])
        dotted = repr(getattr(args, action.dest))
    except SystemExit:
        pass
    found[flag] = {"shortest": shortest, "dotted": dotted}
print(json.dumps(found))
print(json.dumps(sorted(o for a in parser._actions for o in a.option_strings)))
"""


def owned_engine_flags() -> list[str]:
    """The keys of the chart's list of flags it sets itself (templates/_validate.tpl)."""
    text = (CHART_DIR / "templates" / "_validate.tpl").read_text()
    after = text.split('define "dflash-serve.validateEngineArgs"', 1)[1]
    block = after.split("$owned := dict", 1)[1].split("\n-}}", 1)[0]
    return re.findall(r'^\s+"(--[a-z0-9-]+)"', block, flags=re.M)


@pytest.fixture(scope="module")
def vllm_parser() -> tuple[dict[str, dict[str, str | None]], list[str]]:
    """What vLLM 0.33.0's parser makes of the owned flags' spellings, and all its flags."""
    flags = owned_engine_flags()
    assert "--block-size" in flags and "--api-key" in flags and len(flags) > 15
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(flags)],
        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
        env=os.environ | {"VLLM_TARGET_DEVICE": "cpu"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    found, every = (json.loads(line) for line in done.stdout.strip().splitlines()[-2:])
    return found, every


@pytest.fixture(scope="module")
def spellings(
    vllm_parser: tuple[dict[str, dict[str, str | None]], list[str]],
) -> dict[str, dict[str, str | None]]:
    return vllm_parser[0]


@pytest.fixture(scope="module")
def every_vllm_flag(vllm_parser: tuple[dict[str, dict[str, str | None]], list[str]]) -> list[str]:
    assert "--max-num-seqs" in vllm_parser[1]
    return vllm_parser[1]


def refusal(arg: str) -> str:
    with pytest.raises(UserError) as err:
        helm_template([], [f"model.extraArgs={{{arg}}}"], "t", "llm")
    return str(err.value)


def test_vllms_parser_reads_abbreviations_of_the_owned_flags(
    spellings: dict[str, dict[str, str | None]],
) -> None:
    """What makes the refusals below matter: vLLM takes these spellings for the flag."""
    assert spellings["--block-size"]["shortest"] is not None
    assert spellings["--api-key"]["shortest"] is not None
    assert spellings["--speculative-config"]["dotted"] is not None


@pytest.mark.parametrize("flag", owned_engine_flags())
def test_the_shortest_spelling_vllm_reads_is_refused_by_name(
    spellings: dict[str, dict[str, str | None]], flag: str
) -> None:
    shortest = spellings[flag]["shortest"]
    for spelt in [flag] + ([shortest] if shortest else []):
        message = refusal(f"{spelt}=1")
        assert spelt in message and flag in message, message


def test_dotted_json_forms_are_refused_by_name(
    spellings: dict[str, dict[str, str | None]],
) -> None:
    dotted = [flag for flag, found in spellings.items() if found["dotted"] is not None]
    assert "--speculative-config" in dotted  # vLLM reads FLAG.key=value as FLAG
    for flag in dotted:
        message = refusal(f"{flag}.method=ngram")
        assert flag in message, message


def test_no_flag_of_vllm_is_refused_for_being_a_prefix_of_an_owned_one(
    spellings: dict[str, dict[str, str | None]], every_vllm_flag: list[str]
) -> None:
    """The chart refuses any prefix of an owned flag: it must never be a flag of its own."""
    owned = set(spellings)
    clashes = [
        (flag, mine)
        for flag in every_vllm_flag
        for mine in owned
        if flag != mine and mine.startswith(flag) and flag.startswith("--")
    ]
    assert not clashes
