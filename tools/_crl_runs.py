"""The CRL runs of two methods in a folder of run summaries, for the tools that compare them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rl_moe.cli import UsageParser
from rl_moe.report.loading import load_runs
from rl_moe.report.runs import ReportError, Run
from rl_moe.report.tables import contexts


def crl_runs(p: UsageParser, folder: Path, names: Sequence[str]) -> tuple[str, dict[str, list[Run]]]:
    """(suite, method -> its CRL runs) of ``names`` in ``folder``; a usage error (exit 2) naming the
    folder, or the unknown method and the methods found."""
    try:
        ctx = contexts(load_runs([folder]))[0]
    except (ReportError, IndexError) as exc:
        p.error(f"{folder}: {exc or 'no runs'}")
    crl = ctx.runs.get("crl", {})
    for name in names:
        if name not in crl:
            p.error(f"unknown method {name!r}; valid choices (methods found): {', '.join(sorted(crl)) or 'none'}")
    return ctx.suite, {name: crl[name] for name in names}
