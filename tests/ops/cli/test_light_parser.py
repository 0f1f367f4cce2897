"""The CLI's parser is built without the optional extras: the sidecar image and a wheel
installed without `[bench]` run `dflash-serve` (sidecar, plan, render, patches) with no aiohttp,
numpy or matplotlib, and `--help` of every subcommand must still work there."""

from __future__ import annotations

import subprocess
import sys


def test_every_subcommand_registers_without_the_bench_extra() -> None:
    code = (
        "import sys\n"
        "for name in ('aiohttp', 'numpy', 'matplotlib'):\n"
        "    sys.modules[name] = None  # importing it raises ImportError\n"
        "from dflash_ops.cli import build_parser\n"
        "build_parser()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
