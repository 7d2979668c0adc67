"""Plasticity diagnostics beside success: each method's value per task, and its difference from the
baseline over runs × tasks with the statistics the success tables use (the IQM difference with a
95% stratified-bootstrap CI, and the permutation p over whole runs).

SPHERE's claim is about the network as much as about success: that it keeps the eNTK effective rank
r_e(K) from falling across tasks (SPHERE, Sec. 3). Each diagnostic of :data:`DIAGNOSTICS` reduces
one TensorBoard tag to one number per run and task: the mean of the values logged in the task's own
segment (its probes; the step where a task ends belongs to it, as in :mod:`rl_moe.report.collapse`).
A difference here is an association between a method and its network's state, beside the success
it reached; it tests no mechanism.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from rl_moe.report.collapse import segment_mean
from rl_moe.report.runs import Run
from rl_moe.report.render import Table
from rl_moe.report.scalars import Curve
from rl_moe.report.stats import VERDICT_REPS, fmt, fmt_ci, fmt_ms, fmt_p, iqm, iqm_difference_ci, mean_std, permutation_p
from rl_moe.report.tables import Context, method_order


class Diagnostic(NamedTuple):
    """One tag compared between methods, and how its rows are labelled."""

    tag: str
    label: str
    digits: int


#: The diagnostics compared, in table order (docs/metrics.md defines each tag).
DIAGNOSTICS: tuple[Diagnostic, ...] = (
    Diagnostic("plasticity/entk_rank", "held-out r_e(K)", 2),
    Diagnostic("plasticity/dormant_ratio", "dormant ratio", 3),
    Diagnostic("plasticity/feature_norm", "feature norm", 2),
    Diagnostic("policy/mean_outside_box", "action means outside the box", 2),
)
#: The tags the table reads (the report loads them beside the plotted ones).
TAGS = tuple(d.tag for d in DIAGNOSTICS)


def diagnostic_matrix(runs: Sequence[Run], scalars: Mapping[Path, Mapping[str, Curve]], tag: str) -> np.ndarray:
    """(R, T) per-task means of ``tag`` over the runs that finished every task and logged it in
    every task's segment; the others are left out."""
    rows = []
    for run in runs:
        if not run.complete:
            continue
        curve = scalars.get(run.path, {}).get(tag)
        values = [segment_mean(curve, run.segment_start(i), run.segment_start(i) + run.segment_length(i)) for i in range(len(run.tasks))]
        if all(math.isfinite(v) for v in values):
            rows.append(values)
    n_tasks = len(runs[0].tasks) if runs else 0
    return np.array(rows, dtype=float).reshape(len(rows), n_tasks)


def _difference_cells(x: np.ndarray, y: np.ndarray, reps: int, digits: int) -> tuple[str, str]:
    """IQM(x) − IQM(y) with its 95% CI (runs resampled per task), and the permutation p."""
    d = iqm_difference_ci(x, y, reps=max(reps, VERDICT_REPS))
    return fmt_ci(d, digits), fmt_p(permutation_p(x, y))


def plasticity_table(ctx: Context, protocol: str, scalars: Mapping[Path, Mapping[str, Curve]], baseline: str, method: str, reps: int) -> Table | None:
    """Per diagnostic and method: per-task mean ± std, the IQM over runs × tasks, and the difference
    from ``baseline``; None when no run logged any of the diagnostics."""
    by_method = ctx.runs.get(protocol, {})
    methods = method_order(list(by_method), baseline, method)
    rows = []
    for diag in DIAGNOSTICS:
        matrices = {m: diagnostic_matrix(by_method[m], scalars, diag.tag) for m in methods}
        base = matrices.get(baseline)
        for m in methods:
            x = matrices[m]
            if not len(x):
                continue
            per_task = [fmt_ms(mean_std(x[:, j]), diag.digits) for j in range(x.shape[1])]
            diff = ("—", "—")
            if m != baseline and base is not None and len(base):
                diff = _difference_cells(x, base, reps, diag.digits)
            rows.append((diag.label, m, str(len(x)), *per_task, fmt(float(iqm(x)), diag.digits), *diff))
    if not rows:
        return None
    caption = (
        f"{ctx.suite} / {ctx.algo} / {protocol.upper()}: plasticity diagnostics, each the mean of what a run logged in the "
        "task's own segment (held-out probe batch); per task mean ± std over the runs that finished every task and logged it, "
        f"then over runs × tasks the IQM and its difference from {baseline} (95% CI: runs resampled per task, "
        f"{max(reps, VERDICT_REPS):,} replicas; p: whole runs exchanged between the two methods). An association between a "
        "method and its network's state, not a test of why it learns"
    )
    header = ("diagnostic", "method", "runs", *ctx.tasks, "IQM", f"IQM − {baseline} [95% CI]", "permutation p")
    return Table(header, tuple(rows), caption)
