"""Continual-learning metrics (Continual World, Wolczyk et al. 2021).

With ``M[i][j]`` the success of the checkpoint after task ``i`` on task ``j``:

- average performance = mean_j M[N-1][j] (the final checkpoint on every task);
- forgetting = mean_j (M[j][j] - M[N-1][j]) over all N tasks (the last task contributes 0);
- forward transfer = mean_j (AUC_j - AUC_ref_j) / (1 - AUC_ref_j), where AUC is the normalized
  area under task j's success curve during its own segment, and the reference is an RL-protocol
  run (every task from scratch). Tasks whose reference AUC is 1 cannot be improved on and are
  left out, as are tasks where either AUC is unknown (NaN); with no usable task the value is None.
  This module holds the one rule; the report (:mod:`rl_moe.report.stats`) uses it with NaN for None.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike


class CLMetrics(NamedTuple):
    """Continual World summary metrics (None where undefined)."""

    average_performance: float | None
    forgetting: float | None
    forward_transfer: float | None

    def to_dict(self) -> dict[str, float | None]:
        return self._asdict()


def average_performance(final_success: Sequence[float]) -> float:
    """Mean success of the final checkpoint over every task."""
    return float(np.mean(final_success))


def forgetting(own_success: Sequence[float], final_success: Sequence[float]) -> float:
    """Mean over tasks of (success right after the task's own segment - final success)."""
    own, final = np.asarray(own_success, dtype=float), np.asarray(final_success, dtype=float)
    return float(np.mean(own - final))


def curve_auc(steps: Sequence[float], success: Sequence[float], start: float, end: float) -> float:
    """Normalized area under a success curve on the segment [start, end] (trapezoid rule).

    Points outside the segment are ignored; the curve is held constant before its first and
    after its last point, so a single point gives its own value.
    """
    s = np.asarray(steps, dtype=float)
    y = np.asarray(success, dtype=float)
    keep = (s >= start) & (s <= end)
    s, y = s[keep], y[keep]
    if s.size == 0:
        raise ValueError(f"no evaluation point in segment [{start}, {end}]")
    order = np.argsort(s, kind="stable")
    s, y = s[order], y[order]
    s = np.concatenate([[start], s, [end]])
    y = np.concatenate([[y[0]], y, [y[-1]]])
    widths = np.diff(s)
    return float(np.sum(widths * (y[1:] + y[:-1]) / 2.0) / (end - start))


def ft_tasks(auc: ArrayLike, auc_ref: ArrayLike) -> np.ndarray:
    """(T,) mask of the tasks forward transfer averages over: both AUCs known and a reference AUC
    below 1 (a reference at 1 cannot be improved on)."""
    a, r = np.asarray(auc, dtype=float), np.asarray(auc_ref, dtype=float)
    return np.isfinite(a) & np.isfinite(r) & (r < 1.0)


def forward_transfer(auc: ArrayLike, auc_ref: ArrayLike) -> float | None:
    """Mean of (AUC - AUC_ref) / (1 - AUC_ref) over the tasks of :func:`ft_tasks`; None when there are none."""
    a, r = np.asarray(auc, dtype=float), np.asarray(auc_ref, dtype=float)
    ok = ft_tasks(a, r)
    return float(np.mean((a[ok] - r[ok]) / (1.0 - r[ok]))) if ok.any() else None


def segment_aucs(
    tasks: Sequence[str], segments: Sequence[Sequence[int]], curves: Mapping[str, Mapping[str, Sequence[float]]]
) -> list[float]:
    """AUC of every task's own segment from the eval curves of ``results.json``."""
    return [curve_auc(curves[t]["steps"], curves[t]["success"], seg[0], seg[1]) for t, seg in zip(tasks, segments)]


def compute_cl_metrics(
    own_success: Sequence[float],
    final_success: Sequence[float],
    aucs: Sequence[float] | None = None,
    ref_aucs: Sequence[float] | None = None,
) -> CLMetrics:
    """All three metrics; forward transfer only when reference AUCs are given."""
    ft = forward_transfer(aucs, ref_aucs) if aucs is not None and ref_aucs is not None else None
    return CLMetrics(average_performance(final_success), forgetting(own_success, final_success), ft)
