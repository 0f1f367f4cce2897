"""Argument types every subcommand uses: one rule for numbers (finite, within stated bounds),
URLs and Kubernetes names, each refusal naming the value and what would be accepted."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from dflash_ops.errors import UserError
from dflash_ops.urls import check_http_url

if TYPE_CHECKING:
    from pydantic import BaseModel

    Model = TypeVar("Model", bound=BaseModel)

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _show(value: float) -> str:
    """1048576, not 1.04858e+06; 0.5 as 0.5."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _bounds(low: float | None, high: float | None, low_open: bool) -> str:
    if low is not None and high is not None:
        lower = f"{'above' if low_open else 'from'} {_show(low)}"
        return f"{lower} {'up ' if low_open else ''}to {_show(high)}"
    if low is not None:
        return f"{'above' if low_open else 'at least'} {_show(low)}"
    assert high is not None
    return f"at most {_show(high)}"


def number(
    kind: type = float,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
) -> Callable[[str], float]:
    """A finite int or float between `low` and `high` (`low_open`: strictly above `low`)."""

    def parse(text: str) -> float:
        try:
            value: float = kind(text)
        except ValueError:
            noun = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number")
        below = low is not None and (value <= low if low_open else value < low)
        if below or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text!r}: must be {_bounds(low, high, low_open)}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def number_list(
    kind: type = float, low: float | None = None, high: float | None = None, low_open: bool = True
) -> Callable[[str], list[float]]:
    """Comma-separated numbers, each as `number` takes it (at least one)."""
    one = number(kind, low, high, low_open)

    def parse(text: str) -> list[float]:
        parts = [part.strip() for part in text.split(",") if part.strip()]
        if not parts:
            raise argparse.ArgumentTypeError(f"{text!r}: expected numbers like 1,4")
        return [one(part) for part in parts]

    return parse


def choice_list(choices: tuple[str, ...], noun: str, example: str) -> Callable[[str], list[str]]:
    """Comma-separated names, each one of `choices` (at least one)."""

    def parse(text: str) -> list[str]:
        names = [name.strip() for name in text.split(",") if name.strip()]
        if not names or any(name not in choices for name in names):
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected {noun} from {', '.join(choices)}, e.g. {example}"
            )
        return names

    return parse


def http_url(text: str) -> str:
    """argparse type of check_http_url."""
    try:
        return check_http_url(text, "")
    except UserError as err:
        raise argparse.ArgumentTypeError(str(err).strip()) from None


def kubernetes_name(text: str) -> str:
    """A namespace or release name: a DNS-1123 label (lowercase letters, digits, '-')."""
    if len(text) > 63 or not DNS_LABEL.match(text):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected lowercase letters, digits and '-', starting and ending with a "
            "letter or digit, at most 63 characters"
        )
    return text


def add_field_flags(
    parser: argparse._ActionsContainer,
    model: type[BaseModel],
    names: tuple[str, ...],
    prefix: str = "",
    low: float = 0,
) -> None:
    """A `--PREFIXNAME` flag per field of `model` (underscores as dashes), its default, help and
    number type from the field; the field's own bounds are checked by `fields_from_flags`."""
    for name in names:
        field = model.model_fields[name]
        kind = float if field.annotation is float else int
        parser.add_argument(
            f"--{prefix}{name.replace('_', '-')}",
            dest=f"{prefix}{name}".replace("-", "_"),
            type=number(kind, low, 1_000_000),
            default=field.default,
            help=f"{field.description or ''} ({field.default})".strip(),
        )


def fields_from_flags(
    model: type[Model],
    args: argparse.Namespace,
    names: tuple[str, ...],
    prefix: str = "",
    **fixed: object,
) -> Model:
    """`model` from the flags add_field_flags made (and `fixed` values); a value the model
    refuses is one line naming the flag and the value."""
    from pydantic import ValidationError

    values = {name: getattr(args, f"{prefix}{name}".replace("-", "_")) for name in names}
    try:
        return model(**values, **fixed)
    except ValidationError as err:
        problem = err.errors()[0]
        name = str(problem["loc"][0])
        flag = f"--{prefix}{name.replace('_', '-')}"
        raise UserError(f"{flag} {values.get(name)}: {problem['msg'].lower()}") from None
