"""Name an unknown option as what it is. argparse reads `bench --no-such-flag 3` as a wrong
sub-command (`invalid choice: '3'`), because the unknown option is skipped and its value taken
for the sub-command; this walks the command line as argparse will, sub-command by sub-command,
and names the first option the parser it reaches does not define, with the closest it does."""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Sequence

NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def _sub_commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _known(parser: argparse.ArgumentParser, name: str) -> argparse.Action | None:
    """The action `name` selects, as argparse matches it (a unique prefix too)."""
    actions = parser._option_string_actions
    if name in actions:
        return actions[name]
    if parser.allow_abbrev and name.startswith("--"):
        matches = {actions[o] for o in actions if o.startswith(name)}
        if len(matches) == 1:
            return matches.pop()
        if matches:  # ambiguous: argparse says so itself
            return next(iter(matches))
    return None


def _values_taken(action: argparse.Action, inline: bool) -> int | str:
    """How many following words the option consumes: a count, or "many" (+, *)."""
    if inline or action.nargs == 0:
        return 0
    if action.nargs is None or action.nargs == "?":
        return 1
    if isinstance(action.nargs, int):
        return action.nargs
    return "many"


def find(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> tuple[argparse.ArgumentParser, str] | None:
    """The parser that would read an unknown option and the message naming it, or None."""
    current, index, words = parser, 0, list(argv)
    while index < len(words):
        word = words[index]
        index += 1
        if word == "--":
            return None
        if word.startswith("-") and len(word) > 1 and not NEGATIVE_NUMBER.match(word):
            name, inline = word.split("=", 1)[0], "=" in word
            action = _known(current, name)
            if action is None:
                if not name.startswith("--"):
                    continue  # short options and their bundles are argparse's to judge
                options = [o for o in current._option_string_actions if o.startswith("--")]
                close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]}?)" if close else ""
                return current, f"unknown option {name}{hint}"
            taken = _values_taken(action, inline)
            if taken == "many":
                while index < len(words) and not words[index].startswith("-"):
                    index += 1
            else:
                index += int(taken)
            continue
        sub = _sub_commands(current).get(word)
        if sub is not None:
            current = sub
    return None
