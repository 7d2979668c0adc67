"""Errors the CLI turns into one-line messages with exit code 2."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


class UsageError(ValueError):
    """A user mistake (bad name, bad number, bad file): the message names the valid choices."""


class MissingDependencyError(UsageError):
    """An optional dependency is absent: the message names the extra or install command."""


class DivergedError(RuntimeError):
    """Training produced a NaN or infinite value (exit code 3): the message names the term, the
    step and the task; the run folder keeps the last finished task and can be resumed."""


def check_choice(value: Any, valid: tuple[Any, ...] | dict[Any, Any], what: str) -> Any:
    """``value`` if it is one of ``valid`` (a dict: its keys), else a :class:`UsageError` naming
    the choices."""
    if value not in valid:
        raise UsageError(f"unknown {what} {value!r}; valid choices: {', '.join(map(str, valid))}")
    return value


def check_keys(given: Iterable[str], valid: Iterable[str], what: str, where: str = "") -> None:
    """Every key of ``given`` is one of ``valid``, else a :class:`UsageError` naming the first
    unknown key, the nearest valid one and the choices (a misspelt optional key must not be
    ignored silently)."""
    valid = tuple(valid)
    unknown = [k for k in given if k not in valid]
    if not unknown:
        return
    near = difflib.get_close_matches(unknown[0], valid, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    raise UsageError(f"unknown {what} {unknown[0]!r}{where}{hint}; valid choices: {', '.join(valid) or 'none'}")


def check_positive(section: str, obj: Any, names: tuple[str, ...], allow_zero: tuple[str, ...] = ()) -> None:
    """Fields ``names`` of ``obj`` must be > 0 and ``allow_zero`` >= 0."""
    for name in (*names, *allow_zero):
        value = getattr(obj, name)  # a settings dataclass's field, named as the user wrote it
        low_ok = value >= 0 if name in allow_zero else value > 0
        if not low_ok:
            bound = ">= 0" if name in allow_zero else "> 0"
            raise UsageError(f"{section}.{name} must be {bound}, got {value}")


def check_within(section: str, obj: Any, names: tuple[str, ...], low: float, high: float, low_open: bool) -> None:
    """Fields ``names`` of ``obj`` must lie in (low, high] (``low_open``) or [low, high]."""
    for name in names:
        value = getattr(obj, name)  # a settings dataclass's field, named as the user wrote it
        if not ((low < value) if low_open else (low <= value)) or value > high:
            raise UsageError(f"{section}.{name} must be in {'(' if low_open else '['}{low:g}, {high:g}], got {value}")
