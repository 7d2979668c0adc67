"""Settings values from text and JSON: ``--set`` strings and suite files parsed by a dataclass
field's type, and frozen settings dataclasses written to and read back from ``config.json``."""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from typing import Any

from rl_moe.errors import UsageError


def jsonable(obj: Any) -> Any:
    """``obj`` with mappings as string-keyed dicts and tuples and lists as lists, as JSON writes them."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return obj


def dataclass_from_dict(cls: type, data: Mapping[str, Any]) -> Any:
    """A settings dataclass from its JSON form (nested dataclasses and tuples restored; fields the
    data lacks keep their defaults)."""
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        value, hint = data[f.name], hints[f.name]
        if dataclasses.is_dataclass(hint):
            value = dataclass_from_dict(hint, value)  # type: ignore[arg-type]
        elif typing.get_origin(hint) is tuple:
            value = tuple(value)
        kwargs[f.name] = value
    return cls(**kwargs)


def parse_value(text: str, hint: Any, key: str) -> Any:
    """Parse ``text`` as the type ``hint`` of field ``key`` (ints, floats, bools, tuples, optionals)."""
    hint, optional = _unwrap_optional(hint)
    if optional and text.lower() in ("none", "null"):
        return None
    try:
        if hint is bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if typing.get_origin(hint) is tuple:
            inner = typing.get_args(hint)[0]
            return tuple(inner(v) for v in text.split(",") if v.strip())
        if hint is int:
            return int(float(text)) if "e" in text.lower() else int(text)
        if hint is float:
            value = float(text)
            if not math.isfinite(value):
                raise ValueError(text)
            return value
        if hint is str:
            return text
    except (ValueError, OverflowError):
        raise _expected(text, hint, key) from None
    return text


def typed_value(value: Any, hint: Any, key: str) -> Any:
    """A suite file's JSON ``value`` as the type ``hint`` of field ``key``, without a round trip
    through text: lists become tuples and an int a float where a float is due (as ``--set``
    parses them); any other type is one line naming the value and the type."""
    hint, optional = _unwrap_optional(hint)
    if optional and value is None:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if typing.get_origin(hint) is tuple and isinstance(value, (list, tuple)):
        return tuple(typed_value(v, typing.get_args(hint)[0], key) for v in value)
    if hint is float and number and math.isfinite(value):
        return float(value)
    if hint is int and number and float(value).is_integer():
        return int(value)
    if hint in (bool, str) and isinstance(value, hint):
        return value
    raise _expected(value, hint, key)


def _unwrap_optional(hint: Any) -> tuple[Any, bool]:
    """``(T, True)`` for ``T | None``, else ``(hint, False)``: both parsers accept None for an
    optional field and otherwise parse the inner type."""
    args = typing.get_args(hint)
    if type(None) not in args:
        return hint, False
    return next(a for a in args if a is not type(None)), True


def _expected(value: Any, hint: Any, key: str) -> UsageError:
    """The one-line error for a value that does not read as ``hint``."""
    what = "finite float" if hint is float else hint.__name__ if isinstance(hint, type) else str(hint)
    return UsageError(f"bad value {value!r} for {key}: expected {'an' if what == 'int' else 'a'} {what}")


def with_settings(section: Any, given: Mapping[str, Any], name: str) -> Any:
    """``section`` (a settings dataclass) with a suite's defaults for it (its ``net`` or ``eval``
    object) put in as typed values; the field names were checked by the suite's loader."""
    hints = typing.get_type_hints(type(section))
    return dataclasses.replace(section, **{k: typed_value(v, hints[k], f"{name}.{k}") for k, v in given.items()})
