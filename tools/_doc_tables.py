"""Tables in the docs that are written from committed data: check them or rewrite them."""

from __future__ import annotations

import sys
from pathlib import Path


def replaced_table(doc: str, header: str, table: str) -> str | None:
    """``doc`` with the table that starts at ``header`` (up to the next blank line, or the end)
    replaced by ``table``; None where ``doc`` holds no such header."""
    start = doc.find(header)
    if start < 0:
        return None
    end = doc.find("\n\n", start)
    return doc[:start] + table + (doc[end:] if end >= 0 else "\n")


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
