"""What the command-line tools (``crl``, ``sweep``, ``evaluate``, ``report``) share."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

#: Exit code of a user mistake (bad flag, name or value): one line on stderr, no traceback.
EXIT_USAGE = 2
#: Ctrl-C: the CLIs stop cleanly with this code (a sweep stops when a trial exits with it).
EXIT_INTERRUPTED = 130


def raised_from_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` stands for a Ctrl-C or SIGTERM: its chain of explicit causes (``raise ...
    from``) holds a KeyboardInterrupt. An error merely raised while handling one (its context, a
    failed clean-up such as a full disk) is its own error and keeps its own report."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        if isinstance(link, KeyboardInterrupt):
            return True
        seen.add(id(link))
        link = link.__cause__
    return False


def reraise_interrupt(exc: BaseException) -> None:
    """Raise a KeyboardInterrupt where ``exc`` stands for one (:func:`raised_from_interrupt`).
    Every handler that turns a broad exception into another error or a fallback (a damaged file, an
    optional import) calls it first, so that a Ctrl-C is never mistaken for that."""
    if raised_from_interrupt(exc):
        raise KeyboardInterrupt from exc


@contextmanager
def interrupts_as_keyboard() -> Iterator[None]:
    """Re-raise an exception that a Ctrl-C caused as the KeyboardInterrupt it is.

    A signal that lands while a C extension is being imported (MuJoCo's lazy import, for one)
    surfaces as that import's ``ImportError: initialization failed``, raised from the
    KeyboardInterrupt; without this it escapes the interrupt handlers as a traceback and exit 1.
    """
    try:
        yield
    except Exception as exc:
        reraise_interrupt(exc)
        raise


class UsageParser(argparse.ArgumentParser):
    """argparse with a one-line error (exit code 2) instead of the usage block."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(EXIT_USAGE)
