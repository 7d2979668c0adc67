"""A regularizer's settings: its config dataclass with ``--set``/suite overrides applied, each
value checked against the field's type, and one line naming the valid choices otherwise."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, TypeVar

C = TypeVar("C")


def build_config(config_class: type[C], config: C | None, overrides: dict[str, Any], what: str) -> C:
    """``config`` (None: ``config_class``'s defaults) with ``overrides`` replacing fields; the
    config's own checks run on the result.

    :param what: the regularizer, as named in the error for an unknown field
    :raises ValueError: for an unknown field, naming the valid ones, or a bad value
    """
    names = [f.name for f in dataclasses.fields(config_class)]  # type: ignore[arg-type]
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise ValueError(f"unknown {what} option {unknown[0]!r}; valid choices: {', '.join(names)}")
    hints = typing.get_type_hints(config_class)
    for name, value in overrides.items():
        _check_type(what, name, value, hints[name])
    base = config_class() if config is None else config
    return dataclasses.replace(base, **overrides) if overrides else base  # type: ignore[type-var]


#: JSON values a field of each type accepts (a suite file's ``"rho": "abc"`` must not pass).
_ACCEPTS: dict[type, tuple[type, ...]] = {float: (int, float), int: (int,), bool: (bool,), str: (str,)}


def _check_type(what: str, name: str, value: Any, hint: Any) -> None:
    """``ValueError`` unless ``value`` fits ``hint`` (plain types and ``X | None``; others pass)."""
    args = typing.get_args(hint)
    options = [a for a in args if a is not type(None)] if args else [hint]
    if value is None and type(None) in args:
        return
    if not all(o in _ACCEPTS for o in options):
        return  # tuples, nested configs: their own __post_init__ checks them
    ok = any(isinstance(value, _ACCEPTS[o]) and not (isinstance(value, bool) and o is not bool) for o in options)
    if not ok:
        wanted = " or ".join(o.__name__ for o in options) + (" or null" if type(None) in args else "")
        raise ValueError(f"{what} option {name!r} must be {wanted}, got {value!r}")
