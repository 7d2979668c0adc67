"""Errors the CLI turns into one-line messages with exit code 2."""

from __future__ import annotations


class UsageError(ValueError):
    """A user mistake (bad name, bad number, bad file): the message names the valid choices."""


class MissingDependencyError(UsageError):
    """An optional dependency is absent: the message names the extra or install command."""


class DivergedError(RuntimeError):
    """Training produced a NaN or infinite value (exit code 3): the message names the term, the
    step and the task; the run folder keeps the last finished task and can be resumed."""
