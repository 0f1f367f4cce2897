"""A wheel installed without an extra: the subcommand that needs it says so in one line, naming
the extra to install (preflight printed the kubernetes client's ImportError traceback)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("hidden", "argv", "says"),
    [
        (("kubernetes",), ["preflight", "-n", "llm"],
         "dflash-serve preflight needs kubernetes: pip install 'dflash-serve[kubernetes]'"),
        (("aiohttp", "numpy", "matplotlib"), ["bench", "--base-url", "http://127.0.0.1:9"],
         "the benchmark needs aiohttp, matplotlib, numpy: pip install 'dflash-serve[bench]'"),
    ],
)  # fmt: skip
def test_a_missing_extra_is_one_line_naming_it(
    hidden: tuple[str, ...], argv: list[str], says: str
) -> None:
    code = (
        "import sys\n"
        f"for name in {hidden!r}:\n"
        "    sys.modules[name] = None  # not installed: importing it raises ImportError\n"
        "from dflash_ops.cli import main\n"
        f"sys.exit(main({argv!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
