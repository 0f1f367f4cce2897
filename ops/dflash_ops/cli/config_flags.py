"""Flags made from a pydantic config's fields: each flag's name, type, bounds, choices, default
and help come from its field, so a field and its flag cannot drift apart (as the sidecar's CLI
does for its settings). A field's `json_schema_extra` may rename its flag (`{"flag": "--k"}`),
leave it out (`{"flag": False}`), or name its value (`{"metavar": "FILE"}`); a bool field whose
default is True gets a `--no-...` flag."""

from __future__ import annotations

import argparse
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic.fields import FieldInfo

from dflash_ops.cli.arguments import number
from dflash_ops.errors import UserError

if TYPE_CHECKING:
    from pydantic import BaseModel

    Model = TypeVar("Model", bound=BaseModel)


def _extra(field: FieldInfo) -> dict[str, Any]:
    extra = field.json_schema_extra
    return extra if isinstance(extra, dict) else {}


def flag_of(name: str, field: FieldInfo) -> str | None:
    """The field's flag, or None when it has none."""
    flag = _extra(field).get("flag")
    if flag is False:
        return None
    if isinstance(flag, str):
        return flag
    if field.annotation is bool and field.default is True:
        return "--no-" + name.replace("_", "-")
    return "--" + name.replace("_", "-")


def _value_type(annotation: Any) -> Any:
    """`X | None` -> X."""
    if get_origin(annotation) in (Union, types.UnionType):
        present = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(present) == 1:
            return present[0]
    return annotation


def _bounds(field: FieldInfo) -> tuple[float | None, float | None, bool]:
    low = high = None
    low_open = False
    for item in field.metadata:
        if getattr(item, "ge", None) is not None:
            low = item.ge
        if getattr(item, "gt", None) is not None:
            low, low_open = item.gt, True
        if getattr(item, "le", None) is not None:
            high = item.le
    return low, high, low_open


def _help(field: FieldInfo) -> str:
    text = field.description or ""
    if field.annotation is bool or field.default is None:
        return text
    default = field.default
    return f"{text} ({default})".strip()


def flagged_fields(model: type[BaseModel], skip: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The fields of `model` that have a flag, less `skip`."""
    return tuple(
        name
        for name, field in model.model_fields.items()
        if name not in skip and flag_of(name, field) is not None
    )


def add_config_flags(
    parser: argparse._ActionsContainer, model: type[BaseModel], skip: tuple[str, ...] = ()
) -> None:
    """A flag per field of `model` that has one (not in `skip`)."""
    for name in flagged_fields(model, skip):
        field = model.model_fields[name]
        flag = flag_of(name, field)
        assert flag is not None
        kwargs: dict[str, Any] = {"dest": name, "help": _help(field)}
        value_type = _value_type(field.annotation)
        if field.annotation is bool:
            kwargs["action"] = "store_false" if field.default is True else "store_true"
        else:
            kwargs["default"] = field.default
            kwargs["metavar"] = _extra(field).get("metavar") or flag[2:].upper().replace("-", "_")
            if get_origin(value_type) is Literal:
                del kwargs["metavar"]  # argparse shows the choices
                kwargs["choices"] = get_args(value_type)
            elif value_type in (int, float):
                low, high, low_open = _bounds(field)
                kwargs["type"] = number(value_type, low, high, low_open)
            elif value_type is Path:
                kwargs["type"] = Path
        parser.add_argument(flag, **kwargs)


def config_from_flags(
    model: type[Model],
    args: argparse.Namespace,
    names: tuple[str, ...],
    command: str,
    **fixed: object,
) -> Model:
    """`model` from the flags add_config_flags made (and `fixed` values); a value the model
    refuses is one line naming the command, the flag and why."""
    from pydantic import ValidationError

    values = {name: getattr(args, name) for name in names if name not in fixed}
    try:
        return model(**values, **fixed)
    except ValidationError as err:
        problem = err.errors()[0]
        where = ""
        if problem["loc"]:
            name = str(problem["loc"][0])
            flag = flag_of(name, model.model_fields[name]) if name in model.model_fields else None
            where = f"{flag or name}: "
        message = str(problem["msg"]).removeprefix("Value error, ")
        raise UserError(f"{command}: {where}{message}") from None
