"""The release script's parts that need no registry: the chart's image values rewritten with every
comment kept, one line for a bad flag or a failing tool. The release itself, against a real
registry: tests/docker/test_release.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dflash_ops.paths import CHART_DIR
from dflash_ops.release import last_message, set_image

DIGEST = "sha256:" + "ab" * 32


def test_image_values_point_at_the_release_and_keep_every_comment() -> None:
    text = (CHART_DIR / "values.yaml").read_text()
    changed = text
    for path in ("image.engine", "image.sidecar", "router.image"):
        changed = set_image(changed, path, f"r.example/x/{path}", "9.9.9", DIGEST)
    values = yaml.safe_load(changed)
    for section, key in (("image", "engine"), ("image", "sidecar"), ("router", "image")):
        block = values[section][key]
        assert block["repository"] == f"r.example/x/{section}.{key}"
        assert (block["tag"], block["digest"]) == ("9.9.9", DIGEST)
    # Nothing else moved: the same lines but for the nine rewritten.
    before, after = text.splitlines(), changed.splitlines()
    assert len(before) == len(after)
    assert sum(a != b for a, b in zip(before, after, strict=True)) == 9
    assert values["door"]["image"] == yaml.safe_load(text)["door"]["image"]


def test_a_tools_retries_are_left_out_of_its_one_line() -> None:
    output = (
        'time="t" level=warning msg="Failed, retrying in 2s ... (2/2). Error: x"\n'
        'time="t" level=fatal msg="Can not copy signatures to docker://h/x: pinging \\"h\\""\n'
    )
    assert last_message(output) == 'Can not copy signatures to docker://h/x: pinging "h"'
    assert last_message("Error: plain\n\n") == "Error: plain"


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--version", "1 0"], "--version '1 0'"),
        (["--lookaside", "https://sigs.example"], "--lookaside-staging 'https://sigs.example'"),
        (["--images", "engine,gpu"], "--images 'engine,gpu': choose from"),
        (["--sign-key", "NO-SUCH-KEY"], "--sign-key NO-SUCH-KEY: gpg has no such key"),
    ],
)
def test_bad_input_is_one_line_naming_it(flags: list[str], says: str, tmp_path: Path) -> None:
    given = {"--registry": "127.0.0.1:9/x", "--version": "1.0", "--sign-key": "NO-SUCH-KEY",
             "--lookaside": f"file://{tmp_path}/sigs"}  # fmt: skip
    given.update(dict(zip(flags[::2], flags[1::2], strict=True)))
    argv = [word for pair in given.items() for word in pair]
    gnupg = tmp_path / "gnupg"
    gnupg.mkdir(mode=0o700)
    done = subprocess.run(
        [sys.executable, "-m", "dflash_ops.release", *argv, "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120, env=os.environ | {"GNUPGHOME": str(gnupg)},
    )  # fmt: skip
    assert done.returncode in (1, 2) and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert says in last, last
