"""``python -m rl_moe.report RUNS... [--out DIR] [--baseline topk] [--method sphere]``."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from rl_moe.cli import UsageParser
from rl_moe.report.build import MISSING_MATPLOTLIB, ReportOptions, build_report
from rl_moe.report.runs import ReportError
from rl_moe.report.stats import VERDICT_REPS
from rl_moe.report.tables import FT_REFERENCES
from rl_moe.rundir import check_writable_folder


def build_parser() -> argparse.ArgumentParser:
    """The report command's arguments."""
    p = UsageParser(
        prog="python -m rl_moe.report",
        description="Aggregate rl_moe run folders into report.md / report.html with PNG figures.",
    )
    p.add_argument("runs", nargs="+", type=Path, help="run folders or parents (searched recursively for results.json)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: <first RUNS folder>/report)")
    p.add_argument("--baseline", default=None, help="reference method of the comparisons (default: topk)")
    p.add_argument("--method", default=None, help="method compared with the baseline (default: sphere)")
    p.add_argument(
        "--tag", action="append", default=[], metavar="TAG",
        help="extra TensorBoard scalar to plot with seed bands (repeatable), e.g. routing/entropy",
    )  # fmt: skip
    p.add_argument(
        "--ft-reference", choices=tuple(FT_REFERENCES), default=ReportOptions.ft_reference,
        help="forward transfer's reference: the RL run of the same seed, or each task's mean over the method's RL runs",
    )  # fmt: skip
    p.add_argument("--reps", type=int, default=ReportOptions.reps, help=f"bootstrap replicas for the CIs (the separation tables' differences use at least {VERDICT_REPS:,})")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point; user errors print one line and return 2."""
    args = build_parser().parse_args(argv)
    if args.reps < 100:
        print(f"error: --reps {args.reps} is too small; valid choices: an integer >= 100", file=sys.stderr)
        return 2
    defaults = ReportOptions()
    tags = defaults.plasticity_tags + tuple(t for t in args.tag if t not in defaults.plasticity_tags)
    opts = ReportOptions(
        baseline=args.baseline or defaults.baseline, method=args.method or defaults.method, reps=args.reps, plasticity_tags=tags,
        ft_reference=args.ft_reference,
    )
    required = tuple(n for n in (args.baseline, args.method) if n)
    first = args.runs[0]
    out = args.out or (first if first.is_dir() else first.parent) / "report"
    try:
        check_writable_folder(out, "--out")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        files = build_report(list(args.runs), out, opts, required=required)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if importlib.util.find_spec("matplotlib") is None:
        print(MISSING_MATPLOTLIB, file=sys.stderr)
    print(f"wrote {files.markdown}, {files.html} and {len(files.figures)} figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
