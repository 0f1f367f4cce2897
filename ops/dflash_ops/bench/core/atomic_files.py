"""A result file replaced whole: written beside it, then renamed over it, so a reader (a
dashboard, `bench compare`, a resumed sweep) sees the old file or the new one, never a part."""

from __future__ import annotations

import os
from pathlib import Path


def replace_text(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)
