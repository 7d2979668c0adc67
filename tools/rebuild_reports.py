"""Rebuild the studies' reports under results/ (report.md, report.html and the PNG figures).

    python -m tools.rebuild_reports                 # every study, in place (results/<study>/report)
    python -m tools.rebuild_reports cw10-paper      # one study
    python -m tools.rebuild_reports --list          # the studies and their report commands
    python -m tools.rebuild_reports sphere-rl/paper --into /tmp/reports --reps 100

Only each study's ``report.md`` is committed; the figures and ``report.html`` are drawn by this
command (results/README.md). Each study keeps the bootstrap replica count its committed
``report.md`` was made with, so a rebuild at the same code reproduces its tables.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: study folder under results/ -> the report's extra arguments (its runs are the folder itself).
STUDIES: dict[str, tuple[str, ...]] = {
    "mw3easy": ("--reps", "2000"),
    "cw10": ("--baseline", "topk", "--method", "sphere", "--reps", "2000"),
    "sphere-rl/paper": ("--reps", "10000"),
    "sphere-rl/scale-invariant": ("--reps", "10000"),
    "sphere-rl/loss-ratio": ("--reps", "10000"),
    "paper-rl": ("--reps", "500"),
    "paper-rl-ablations/lecun": ("--reps", "500"),
    "paper-rl-ablations/normobs": ("--reps", "500"),
    "hammer-grid": ("--reps", "500"),
    "cw10-paper": ("--baseline", "topk", "--method", "sphere", "--reps", "2000"),
    "cw10-paper-full": ("--baseline", "topk", "--method", "ln", "--ft-reference", "mean", "--reps", "2000"),
}


def report_args(study: str, into: Path | None = None, reps: int | None = None) -> list[str]:
    """The ``python -m rl_moe.report`` arguments that rebuild ``study``'s report."""
    extra = list(STUDIES[study])
    if reps is not None:
        i = extra.index("--reps")
        extra[i + 1] = str(reps)
    runs = REPO / "results" / study
    out = (into / study if into else runs) / "report"
    return [str(runs), "--out", str(out), *extra]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.rebuild_reports", description=__doc__.split("\n")[0])
    p.add_argument("studies", nargs="*", help=f"studies to rebuild (default: all): {', '.join(STUDIES)}")
    p.add_argument("--into", type=Path, default=None, help="write under INTO/<study>/report instead of in place")
    p.add_argument("--reps", type=int, default=None, help="override every study's bootstrap replica count")
    p.add_argument("--list", action="store_true", help="print each study's report command and exit")
    args = p.parse_args(argv)
    unknown = [s for s in args.studies if s not in STUDIES]
    if unknown:
        print(f"error: unknown study {unknown[0]!r}; valid choices: {', '.join(STUDIES)}", file=sys.stderr)
        return 2
    studies = args.studies or list(STUDIES)
    if args.list:
        for s in studies:
            print("python -m rl_moe.report " + " ".join(report_args(s, args.into, args.reps)).replace(str(REPO) + "/", ""))
        return 0
    from rl_moe.report.__main__ import main as report  # lazy: --list needs no torch or matplotlib

    for s in studies:
        code = report(report_args(s, args.into, args.reps))
        if code:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
