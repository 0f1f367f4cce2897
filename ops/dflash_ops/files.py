"""The one way the CLI reads a user's file: every OS, decoding, JSON, YAML and shape error
becomes one UserError line naming the file and the problem (never a traceback)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from dflash_ops.errors import UserError

MAX_BYTES = 64 * 1024 * 1024  # no input the CLI reads is anywhere near this


def read_text(path: str | Path, what: str, max_bytes: int = MAX_BYTES) -> str:
    """The file's UTF-8 text; `what` names the input in errors (e.g. "--draft-config")."""
    path = Path(path)
    try:
        if path.is_dir():
            raise UserError(f"{what} {path} is a directory, not a file")
        size = path.stat().st_size
        if size > max_bytes:
            raise UserError(f"{what} {path} is {size} bytes: not an input file")
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise UserError(f"{what} {path} not found") from None
    except PermissionError:
        raise UserError(f"{what} {path}: permission denied") from None
    except UnicodeDecodeError as err:
        raise UserError(f"{what} {path} is not UTF-8 text (byte {err.start})") from None
    except OSError as err:
        raise UserError(f"{what} {path}: {err.strerror or err}") from None


def _shape(value: Any, expect: type, path: Path, what: str, kind: str) -> Any:
    if not isinstance(value, expect):
        names: dict[type, str] = {dict: "a mapping", list: "a list"}
        wanted = names.get(expect, expect.__name__)
        raise UserError(f"{what} {path}: expected {wanted} of {kind}, got {type(value).__name__}")
    return value


def read_json(path: str | Path, what: str, expect: type = dict) -> Any:
    text = read_text(path, what)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"{what} {path} is not valid JSON: {err}") from None
    return _shape(value, expect, Path(path), what, "JSON")


def read_yaml(path: str | Path, what: str, expect: type = dict, empty: Any = None) -> Any:
    """The YAML document of the file (`empty` for an empty file)."""
    text = read_text(path, what)
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UserError(f"{what} {path} is not valid YAML{at}: {problem}") from None
    if value is None and empty is not None:
        return empty
    return _shape(value, expect, Path(path), what, "YAML")
