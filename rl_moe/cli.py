"""What the command-line tools (``crl``, ``sweep``, ``evaluate``, ``report``) share."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

#: Exit code of a user mistake (bad flag, name or value): one line on stderr, no traceback.
EXIT_USAGE = 2
#: Ctrl-C: the CLIs stop cleanly with this code (a sweep stops when a trial exits with it).
EXIT_INTERRUPTED = 130


class UsageParser(argparse.ArgumentParser):
    """argparse with a one-line error (exit code 2) instead of the usage block."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(EXIT_USAGE)
