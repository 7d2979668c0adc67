"""Rebuild the studies' reports under results/ (report.md, report.html and the PNG figures).

    python -m tools.rebuild_reports                 # every study, in place (results/<study>/report)
    python -m tools.rebuild_reports cw10-paper      # one study
    python -m tools.rebuild_reports --list          # the studies and their report commands
    python -m tools.rebuild_reports sphere-rl/paper --into /tmp/reports --reps 100

Only each study's ``report.md`` is committed; the figures and ``report.html`` are drawn by this
command (results/README.md). The one figure README.md embeds is committed under docs/img/ and is
copied there from its study's report by the same command (:data:`README_FIGURES`). Each study keeps the bootstrap replica count its committed
``report.md`` was made with, so a rebuild at the same code reproduces its tables.
"""

from __future__ import annotations

import argparse
import shutil
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
    "slice-authors": ("--baseline", "topk", "--method", "sphere", "--reps", "2000"),
    # Top-K alone until a SPHERE run finishes all ten tasks (the report refuses a method it lacks)
    "slice-authors-full": ("--baseline", "topk", "--reps", "2000"),
}

#: study -> (a figure its report draws, where README.md embeds it): the answer's figure, success
#: over r_e(K) per task, Top-K against SPHERE on the authors' network, as the slice's runs stand.
README_FIGURES: dict[str, tuple[str, str]] = {
    "slice-authors": ("success-and-entk_rank_cw10_ppo_crl.png", "docs/img/slice_authors.png"),
}


def copy_readme_figure(study: str, into: Path | None = None) -> Path | None:
    """Copy ``study``'s README figure from its rebuilt report to docs/img/ (under ``into`` when
    given); None when the study has none. A report that did not draw it is an error: README.md
    would embed a stale picture."""
    if study not in README_FIGURES:
        return None
    name, target = README_FIGURES[study]
    drawn = (into / study if into else REPO / "results" / study) / "report" / name
    if not drawn.is_file():
        raise FileNotFoundError(f"{study}'s report did not draw {name}, which README.md embeds as {target}")
    dest = (into if into else REPO) / target
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(drawn, dest)
    return dest


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
        copy_readme_figure(s, args.into)
    return 0


if __name__ == "__main__":
    sys.exit(main())
