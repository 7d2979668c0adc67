"""SPHERE's collapse, the action box and r_e(K), per seed and task, beside success.

An update is *collapsed* by :func:`rl_moe.regularizers.sphere.is_collapsed` (lambda above 1e4 or
the penalty below 1e-8; docs/results.md, "Definitions"). Runs that log ``train/sphere_collapsed``
are read directly; older runs are judged from their logged ``train/coef_sphere`` and
``train/loss_sphere`` by the same rule. The action-box share is ``policy/mean_outside_box``: the
share of action-mean entries outside the action space on the probe batch.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from rl_moe.regularizers.sphere import is_collapsed
from rl_moe.report.runs import Run
from rl_moe.report.render import Table
from rl_moe.report.scalars import Curve
from rl_moe.report.tables import Context, method_order

#: The tags this table reads (the report loads them beside the plotted ones).
TAGS = ("train/sphere_collapsed", "train/coef_sphere", "train/loss_sphere", "policy/mean_outside_box", "policy/mean_outside_box_online", "plasticity/entk_rank")


def collapse_flags(curves: dict[str, Curve]) -> Curve | None:
    """1.0 per collapsed update, 0.0 otherwise; None for a run without SPHERE's logs."""
    if "train/sphere_collapsed" in curves:
        return curves["train/sphere_collapsed"]
    loss = curves.get("train/loss_sphere")
    if loss is None:
        return None
    coef = curves.get("train/coef_sphere")
    coefs = dict(zip(coef.steps.tolist(), coef.values.tolist())) if coef is not None else {}
    flags = [float(is_collapsed(coefs.get(s, 0.0), v)) for s, v in zip(loss.steps.tolist(), loss.values.tolist())]
    return Curve(loss.steps, np.array(flags))


def segment_mean(curve: Curve | None, start: int, end: int) -> float:
    """Mean of the values logged in (start, end]: a segment's own updates or probes (the boundary
    step belongs to the task that ends there). NaN where none."""
    if curve is None:
        return math.nan
    inside = (curve.steps > start) & (curve.steps <= end)
    return float(curve.values[inside].mean()) if inside.any() else math.nan


def segment_last(curve: Curve | None, start: int, end: int) -> float:
    """The last value logged in (start, end] (a segment's last probe), NaN where none."""
    if curve is None:
        return math.nan
    inside = (curve.steps > start) & (curve.steps <= end)
    return float(curve.values[inside][-1]) if inside.any() else math.nan


def _pct(x: float) -> str:
    return "—" if math.isnan(x) else f"{100 * x:.0f}%"


def run_row(run: Run, curves: dict[str, Curve]) -> list[str]:
    """One cell per task: own-task success / collapsed share / action-box share / held-out r_e(K)
    at the segment's last probe; dashes for a task the run has not finished."""
    flags = collapse_flags(curves)
    box, rank = curves.get("policy/mean_outside_box"), curves.get("plasticity/entk_rank")
    cells = []
    for i in range(len(run.tasks)):
        if run.segments and i >= len(run.segments):
            # a task still training (or not begun): its probes so far are no segment's last
            cells.append("— / — / — / —")
            continue
        start, end = run.segment_start(i), run.segment_start(i) + run.segment_length(i)
        own = run.own[i] if i < len(run.own) else math.nan
        success = "—" if math.isnan(own) else f"{own:.2f}"
        r_e = segment_last(rank, start, end)
        cells.append(f"{success} / {_pct(segment_mean(flags, start, end))} / {_pct(segment_mean(box, start, end))} / {'—' if math.isnan(r_e) else f'{r_e:.2f}'}")
    return cells


def collapse_table(ctx: Context, scalars: dict[Path, dict[str, Curve]], baseline: str, method: str) -> Table | None:
    """Seeds × tasks: success, collapsed updates and action-box share of every CRL/RL run."""
    rows = []
    for protocol, by_method in ctx.runs.items():
        for m in method_order(list(by_method), baseline, method):
            for run in sorted(by_method[m], key=lambda r: r.seed):
                rows.append((f"{protocol} {m} s{run.seed}", *run_row(run, scalars.get(run.path, {}))))
    if not rows:
        return None
    caption = (
        f"{ctx.suite} / {ctx.algo}: per seed and task, own-task success / share of the task's updates that are collapsed "
        "(SPHERE's λ > 1e4 or its penalty < 1e-8) / share of action-mean entries outside the action box on the held-out "
        "probe batch (mean over the task's probes) / r_e(K) on the held-out probe batch at the task's last probe; — where the "
        "run did not log it"
    )
    return Table(("run", *ctx.tasks), tuple(rows), caption)
