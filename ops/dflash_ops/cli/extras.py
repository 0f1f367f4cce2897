"""A subcommand that needs one of the wheel's extras says which, in one line, before it starts
(installed without it, an import deep inside would end in a traceback)."""

from __future__ import annotations

import importlib.util

from dflash_ops.errors import UserError


def require_extra(extra: str, modules: tuple[str, ...], what: str) -> None:
    """UserError naming the missing modules and the extra that brings them."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(f"{what} needs {', '.join(missing)}: pip install 'dflash-serve[{extra}]'")
