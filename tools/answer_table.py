"""The slice's answer in one table, for README's "The answer" and docs/results.md's top:
each method's own-segment success under both readings and held out, and its difference to Top-K;
and beside it, per task, each method's success against the paper's Table 14 rows.

    python -m tools.answer_table                 # print both tables (complete runs of results/slice-authors)
    python -m tools.answer_table --write         # rewrite them where README.md and docs/results.md hold them
    python -m tools.answer_table --check         # exit 1 where a doc's copy differs from the data

Columns, over each method's complete runs (docs/results.md, "Definitions and statistics"):

- **ours** and **authors'**: the task average of own-segment success, mean ± std over seeds (ddof
  0). Ours is success at any step on the training positions (``own_success``), the statistic of
  §8's decision rule; the authors' is the last step on training envs 0 and 1
  (:mod:`rl_moe.report.readings`).
- **held out**: the same on 25 held-out positions (``positions-25.json``).
- **IQM − Top-K [95% CI]** under each of the two readings: the IQM over run × task cells, the CI
  from resampling each method's runs per task (20,000 replicas, as the decision reads it).
- **perm. p**: whole runs exchanged between the method and Top-K, under our reading (three decimals, as
  the report writes it: at 10 seeds against 10 it can be well below 0.01).

The per-task table gives our reading per task (mean ± std over seeds) and the task average, each
method followed by its row of the paper's Table 14 (5 seeds; the paper gives no std for an average
over these three tasks alone, so its average is the mean of its three task means).

A doc holds each table from its header line to the next blank line.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rl_moe.report.loading import load_runs
from rl_moe.report.runs import ReportError, Run
from rl_moe.report.paper import paper_cells
from rl_moe.report.readings import run_readings
from rl_moe.report.stats import (
    VERDICT_REPS,
    fmt,
    fmt_ci,
    fmt_ms,
    fmt_p,
    iqm_difference_ci,
    mean_std,
    permutation_p,
)
from rl_moe.report.tables import contexts
from tools._doc_tables import check_or_write, replaced_table
from tools.slice_table import FOLDER, METHODS, method_key

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md", ROOT / "docs" / "results.md")
BASELINE = "topk"
#: Labels (the rows follow tools.slice_table's method order); a method not named here keeps its own name.
LABELS = {"topk": "Top-K", "sphere": "SPHERE (paper's rule)", "ln": "LN"}
HEADER = (
    "| method | seeds | ours: any step | authors': last step, envs 0–1 | held out (25 positions) "
    "| IQM − Top-K, ours [95% CI] | IQM − Top-K, authors' [95% CI] | perm. p, ours |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|\n"
)


#: The per-task table's header: fixed, whatever methods the folder holds, so that --write finds it.
PER_TASK_HEADER = (
    "| method | seeds | hammer | push-wall | faucet-close | average |\n"
    "|---|---:|---:|---:|---:|---:|\n"
)
TASKS = ("hammer-v3", "push-wall-v3", "faucet-close-v3")


class AnswerError(ValueError):
    """The folder cannot give the table (no CRL runs, no baseline, a reading missing)."""


def _complete(runs: Sequence[Run]) -> list[Run]:
    return sorted((r for r in runs if all(math.isfinite(v) for v in r.own)), key=lambda r: r.seed)


def _scores(runs: Sequence[Run]) -> dict[str, np.ndarray]:
    """(runs, tasks) matrices per reading: ``ours``, ``authors`` and ``heldout``."""
    readings = [run_readings(r) for r in runs]
    return {
        "ours": np.array([x.any_step for x in readings], dtype=float),
        "authors": np.array([x.authors for x in readings], dtype=float),
        "heldout": np.array([x.heldout for x in readings], dtype=float),
    }


def _mean_std(scores: np.ndarray) -> str:
    if not np.isfinite(scores).all():
        return "—"
    return fmt_ms(mean_std(scores.mean(axis=1)))


def _difference(x: np.ndarray, y: np.ndarray) -> str:
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        return "—"
    d = iqm_difference_ci(x, y, reps=VERDICT_REPS)
    # the docs' prose writes negatives with a minus sign, not a hyphen
    return fmt_ci(d).replace("-", "\u2212")


def _complete_runs(folder: Path) -> dict[str, list[Run]]:
    """Each method's complete CRL runs, by seed, methods in the slice's order, Top-K among them."""
    try:
        ctx = contexts(load_runs([folder]))[0]
    except (ReportError, IndexError) as exc:
        raise AnswerError(f"{folder}: {exc or 'no runs'}") from exc
    crl = {m: _complete(runs) for m, runs in ctx.runs.get("crl", {}).items()}
    crl = {m: runs for m, runs in crl.items() if runs}
    if BASELINE not in crl:
        raise AnswerError(f"{folder}: no complete {BASELINE} runs; methods found: {', '.join(sorted(crl)) or 'none'}")
    if any(r.tasks != TASKS for runs in crl.values() for r in runs):
        raise AnswerError(f"{folder}: a run's tasks are not the slice's {', '.join(TASKS)}")
    return {m: crl[m] for m in sorted(crl, key=method_key)}


#: Each method's complete runs and their (runs, tasks) scores per reading, in the slice's order.
Scored = dict[str, tuple[list[Run], dict[str, np.ndarray]]]


def _scored(folder: Path) -> Scored:
    return {m: (runs, _scores(runs)) for m, runs in _complete_runs(folder).items()}


def _rows(scored: Scored) -> list[str]:
    base = scored[BASELINE][1]
    out = []
    for m, (runs, s) in scored.items():
        if m == BASELINE:
            diffs = ("—", "—", "—")
        else:
            diffs = (_difference(s["ours"], base["ours"]), _difference(s["authors"], base["authors"]), fmt_p(permutation_p(s['ours'], base['ours'])))
        cells = (LABELS.get(m, m), str(len(runs)), _mean_std(s["ours"]), _mean_std(s["authors"]), _mean_std(s["heldout"]), *diffs)
        out.append("| " + " | ".join(cells) + " |")
    return out


def _per_task_rows(scored: Scored) -> list[str]:
    out = []
    for m, (runs, s) in scored.items():
        ours = s["ours"]
        cells = [fmt_ms(mean_std(ours[:, t])) for t in range(len(TASKS))]
        out.append(f"| {LABELS.get(m, m)} | {len(runs)} | " + " | ".join(cells) + f" | {_mean_std(ours)} |")
        paper = paper_cells("crl", m, TASKS)
        if paper is not None:
            tasks = paper[: len(TASKS)]
            average = fmt(float(np.mean([c.mean for c in tasks])))
            out.append(f"| {METHODS.get(m, m)}, the paper's Table 14 | {tasks[0].n} | " + " | ".join(fmt_ms(c) for c in tasks) + f" | {average} |")
    return out


def rows(folder: Path = FOLDER) -> list[str]:
    """One table row per method with complete CRL runs, Top-K first."""
    return _rows(_scored(folder))


def table(folder: Path = FOLDER) -> str:
    return HEADER + "\n".join(rows(folder))


def per_task_rows(folder: Path = FOLDER) -> list[str]:
    """Per method: our reading per task and averaged over them, then the paper's Table 14 row."""
    return _per_task_rows(_scored(folder))


def per_task_table(folder: Path = FOLDER) -> str:
    return PER_TASK_HEADER + "\n".join(per_task_rows(folder))


def tables(folder: Path = FOLDER) -> dict[str, str]:
    """Both tables by their headers, from one read of the runs."""
    scored = _scored(folder)
    return {HEADER: HEADER + "\n".join(_rows(scored)), PER_TASK_HEADER: PER_TASK_HEADER + "\n".join(_per_task_rows(scored))}


def replaced(doc: str, new_table: str, header: str = HEADER) -> str | None:
    """``doc`` with its table that starts at ``header`` replaced by ``new_table``; None where it
    holds none."""
    return replaced_table(doc, header, new_table)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the table in README.md and docs/results.md where they hold it")
    mode.add_argument("--check", action="store_true", help="only compare; exit 1 where a doc's copy differs from the data")
    opts = p.parse_args(argv)
    try:
        new_tables = tables()
    except AnswerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not (opts.write or opts.check):
        print("\n\n".join(new_tables.values()))
        return 0
    rc = 0
    for doc in DOCS:
        old = new = doc.read_text()
        for header, new_table in new_tables.items():
            new = replaced(new, new_table, header) or new
        if new != old or opts.check:
            rc = max(rc, check_or_write(doc, old, new, opts.check, f"{doc.name}'s answer tables", "python -m tools.answer_table --write"))
    return rc


if __name__ == "__main__":
    sys.exit(main())
