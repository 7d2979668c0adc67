"""Errors the CLI turns into one-line messages with exit code 2."""

from __future__ import annotations


class UsageError(ValueError):
    """A user mistake (bad name, bad number, bad file): the message names the valid choices."""


class MissingDependencyError(UsageError):
    """An optional dependency is absent: the message names the extra or install command."""
