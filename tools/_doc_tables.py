"""Tables in the docs that are written from committed data: check them or rewrite them."""

from __future__ import annotations

import sys
from pathlib import Path


def check_or_write(doc: Path, old: str, new: str, check: bool, what: str, command: str) -> int:
    """With ``check``: 0 where ``doc`` already reads ``new``, else 1 and a line naming ``what``
    differs and the ``command`` that rewrites it. Without: write ``new`` and return 0."""
    if check:
        if new != old:
            print(f"{what} differs from the data; run {command}", file=sys.stderr)
            return 1
        return 0
    doc.write_text(new)
    return 0
