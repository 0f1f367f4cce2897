"""Every command the README and the docs show is held to what it claims: a shell block carries a
`<!-- docs-check: KIND -->` mark on the line before it, and

- `run`: the block runs here, as shown, in bash with `set -e` (the shell variables it names are
  set by this test, as its comment says the user sets them);
- `parse`: it needs a running engine or takes minutes; each command is read by what would run
  it: `dflash-serve` by the CLI's own parser, `make` by `make -n`, `helm install|upgrade` by
  `helm template` on this checkout's chart;
- `cluster`, `gpu`: it needs one; its `dflash-serve`, `make` and `helm` commands are still read
  as `parse` reads them (kubectl, curl and the like are not).

A block without a mark, with an unknown one, or whose command no longer parses fails the suite,
naming the file and line (a shown `plan --k 0-15 --format helm-values` once exited 2 for two
turns). Every code span in the prose that starts with `dflash-serve ` and shows a command line
(options, not a lone command or flag named) is read by the parser too.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from dflash_ops.chart.helm import helm_binary
from dflash_ops.paths import CHART_DIR

from tests.conftest import REPO_ROOT

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
SHELL = {"bash", "sh", "shell", "console"}
KINDS = {"run", "parse", "cluster", "gpu"}
MARK = re.compile(r"<!-- docs-check: (\S+) -->")
OPERATORS = {"|", "||", "&&", ";", "&"}
VENV_BIN = REPO_ROOT / ".venv" / "bin"


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    kind: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO_ROOT)}:{self.line}"


def fences(page: Path) -> Iterator[tuple[int, str, str, str]]:
    """(line of the opening fence, its language, the line before it, the body) per fence."""
    lines = page.read_text().splitlines()
    index = 0
    while index < len(lines):
        stripped = lines[index].strip()
        if stripped.startswith("```"):
            start, language = index, stripped[3:].strip()
            before = next((b.strip() for b in reversed(lines[:index]) if b.strip()), "")
            end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == "```")
            body = "\n".join(line.strip() for line in lines[start + 1 : end])
            yield start + 1, language, before, body
            index = end
        index += 1


def blocks() -> list[Block]:
    found = []
    for page in PAGES:
        for line, language, before, body in fences(page):
            if language not in SHELL:
                continue
            mark = MARK.fullmatch(before)
            found.append(Block(page, line, mark.group(1) if mark else "", body))
    return found


def commands(text: str) -> list[list[str]]:
    """Each simple command of a block, as the shell splits its words (comments dropped,
    continuations joined, pipelines and lists split)."""
    found: list[list[str]] = []
    for logical in text.replace("\\\n", " ").splitlines():
        words = shlex.split(logical, comments=True)
        current: list[str] = []
        for word in words:
            if word in OPERATORS:
                found.append(current)
                current = []
            else:
                current.append(word.rstrip(";&") if word.endswith((";", "&")) else word)
        found.append(current)
    return [c for c in found if c]


def cli_refusal(argv: list[str]) -> str | None:
    """What the CLI's own parser says of these arguments (None: it takes them). Nothing runs."""
    from dflash_ops.cli import build_parser, parse_words

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parse_words(build_parser(), argv)
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            return err.getvalue().strip() or f"exit {exit_.code}"
    return None


HELM_DROPPED_FLAGS = {"--wait", "--reuse-values", "--atomic", "--install"}
HELM_DROPPED_OPTIONS = {"--timeout", "--version"}


def helm_template_argv(words: list[str]) -> list[str]:
    """`helm install|upgrade NAME CHART ...` as `helm template` of this checkout's chart (the
    published chart is this one: tests/docker/test_release.py compares them)."""
    name, _chart, *rest = words[2:]
    argv = [str(helm_binary()), "template", name, str(CHART_DIR)]
    skip = False
    for word in rest:
        if skip:
            skip = False
        elif word in HELM_DROPPED_FLAGS:
            continue
        elif word in HELM_DROPPED_OPTIONS:
            skip = True
        elif word.startswith("dflash-serve/"):
            argv.append(str(CHART_DIR / word.removeprefix("dflash-serve/")))
        else:
            argv.append(word)
    return argv


def read_problems(block: Block) -> list[str]:
    """What the tools that would run each command say of it, without running it."""
    problems = []
    for words in commands(block.text):
        program = words[0]
        if program == "dflash-serve":
            refusal = cli_refusal(words[1:])
            if refusal:
                problems.append(f"{shlex.join(words)}\n  {refusal.splitlines()[-1]}")
        elif program == "make":
            done = subprocess.run(
                ["make", "-n", *words[1:]], cwd=REPO_ROOT, capture_output=True, text=True
            )
            if done.returncode != 0:
                problems.append(f"{shlex.join(words)}\n  {done.stderr.strip()[-300:]}")
        elif program == "helm" and words[1] in ("install", "upgrade"):
            done = subprocess.run(
                helm_template_argv(words), capture_output=True, text=True, timeout=120
            )
            if done.returncode != 0:
                problems.append(f"{shlex.join(words)}\n  {done.stderr.strip()[-500:]}")
    return problems


ALL = blocks()


def test_every_shell_block_is_marked() -> None:
    unmarked = [f"{b.where}: {b.kind or 'no mark'}" for b in ALL if b.kind not in KINDS]
    assert not unmarked, (
        "shell blocks need <!-- docs-check: run|parse|cluster|gpu --> on the line before:\n"
        + "\n".join(unmarked)
    )


def test_every_fence_names_its_language() -> None:
    """A command block without a language would escape the mark above."""
    bare = [
        f"{page.relative_to(REPO_ROOT)}:{line}"
        for page in PAGES
        for line, language, _, _ in fences(page)
        if not language
    ]
    assert not bare, "fences without a language (```text for output): " + ", ".join(bare)


@pytest.mark.parametrize(
    "block", [b for b in ALL if b.kind in KINDS - {"run"}], ids=lambda b: b.where
)
def test_shown_commands_parse(block: Block) -> None:
    problems = read_problems(block)
    assert not problems, f"{block.where}: stale commands:\n" + "\n".join(problems)


def prose_commands() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        for span in re.findall(r"`(dflash-serve [^`]+)`", text):
            found.append((page.name, " ".join(span.split())))
    return found


def test_commands_in_the_prose_parse() -> None:
    problems = []
    for page, span in prose_commands():
        words = [w for w in shlex.split(span) if w != "..."]
        if not any(w.startswith("-") for w in words) or words[-1].startswith("--"):
            continue  # a command or a flag named, not a command line shown
        refusal = cli_refusal(words[1:])
        if refusal:
            problems.append(f"{page}: `{span}`\n  {refusal.splitlines()[-1]}")
    assert not problems, "stale commands in the prose:\n" + "\n".join(problems)


def vllm_033_site_packages(dest: Path) -> Path:
    """The files the patch series touches and vLLM's dist-info, from the pinned 0.33.0 wheel:
    the site-packages a user's `patches` commands run against."""
    from dflash_patches.series import load_manifest

    manifest = load_manifest()
    wheel = REPO_ROOT / ".cache" / "wheels" / str(manifest.wheel)
    if not wheel.is_file():
        pytest.fail(f"{wheel} is missing: `make setup` fetches vllm==0.33.0")
    targets = {t for p in manifest.patches for t in p.targets}
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name in targets or ".dist-info/" in name:
                archive.extract(name, dest)
    return dest


def run_block(block: Block, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"}
    if "SITE_PACKAGES" in block.text:
        env["SITE_PACKAGES"] = str(vllm_033_site_packages(tmp_path / "site-packages"))
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.text],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("block", [b for b in ALL if b.kind == "run"], ids=lambda b: b.where)
def test_run_blocks_run(block: Block, tmp_path: Path) -> None:
    done = run_block(block, tmp_path)
    assert done.returncode == 0, f"{block.where} exited {done.returncode}:\n{done.stderr[-2000:]}"


def test_every_kind_of_check_catches_a_stale_command(tmp_path: Path) -> None:
    """The checks themselves: the command the README once showed for two turns, a flag that is
    gone, a make target that is not there and a chart value the schema refuses all fail."""
    stale = Block(
        PAGES[0], 1, "run", "dflash-serve plan --gpu h100 --tp 2 --k 0-15 --format helm-values"
    )
    assert "pass one --k" in run_block(stale, tmp_path).stderr
    assert cli_refusal(["plan", "--gpu", "h100", "--tp", "2", "--k", "0-15"]) is None
    for text, says in (
        ("dflash-serve bench --base-url http://127.0.0.1:8000 --result-dirr out", "--result-dirr"),
        ("make demo-upp", "demo-upp"),
        (
            "helm install dflash oci://example/dflash-serve --version 0.1.0 --wait \\\n"
            "  --timeout 5m -f dflash-serve/profiles/a100-tp2-dflash2.yaml \\\n"
            "  --set engine.blockSize=1616",
            "1616",
        ),
    ):
        problems = read_problems(Block(PAGES[0], 1, "cluster", text))
        assert len(problems) == 1 and says in problems[0], (text, problems)
    assert read_problems(Block(PAGES[0], 1, "cluster", "kubectl -n llm get pods | head")) == []


def test_the_prose_check_reads_the_command_lines_shown() -> None:
    spans = [span for _, span in prose_commands()]
    assert "dflash-serve plan --gpu a100 --tp 2 --k 4-8" in spans
    assert len(spans) > 20, spans
