"""The success readings of a run side by side: ours, the SPHERE authors', and held-out.

- **Ours**: success at any step of the episode, on the training positions (``eval.n_envs`` eval
  envs, 5 by default, seeded as the first training envs); ``own_success`` of ``results.json``.
- **Last step, same positions**: ``success_last`` of the own-segment evaluation
  (``eval_curves``' point at the segment's end).
- **The authors'**: success at the episode's last step on training envs 0 and 1 only, as the
  SPHERE authors' code reads it. It needs each env's score, which runs record from the commit
  that added ``own_per_env`` to ``results.json``. Earlier runs logged only the last-step fraction
  over all the envs' episodes; that fraction bounds envs 0 and 1's (:func:`authors_bounds`) but
  does not give it.
- **Held-out**: the own task's checkpoint on held-out positions (``positions-<N>.json``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from rl_moe.report.runs import Run
from rl_moe.report.render import Table
from rl_moe.report.stats import MeanStd, fmt, fmt_ms, mean_std

#: The envs the authors' reading scores (training envs 0 and 1).
AUTHORS_ENVS = 2
#: Eval views whose envs are the training envs' positions (``rules["eval_positions"]``).
TRAIN_VIEWS = ("train", "both")
NAN = float("nan")


class Readings(NamedTuple):
    """One run's own-segment success per task under each reading (NaN where not available).

    :param any_step: ours: any step, the training positions
    :param last_step: the last step, the same positions
    :param authors: the last step, envs 0 and 1 (runs that recorded ``own_per_env``)
    :param authors_low: where ``authors`` is not recorded, the least it can be given ``last_step``
    :param authors_high: the most it can be
    :param heldout: held-out positions
    """

    any_step: tuple[float, ...]
    last_step: tuple[float, ...]
    authors: tuple[float, ...]
    authors_low: tuple[float, ...]
    authors_high: tuple[float, ...]
    heldout: tuple[float, ...]


def episodes_per_env(n_episodes: int, n_envs: int) -> list[int]:
    """Each eval env's episode quota (:func:`rl_moe.continual.evaluation.evaluate`'s split)."""
    k = max(1, min(n_envs, n_episodes))
    return [(n_episodes + i) // k for i in range(k)]


def authors_bounds(last_step: float, quota: Sequence[int]) -> tuple[float, float]:
    """The range of envs 0 and 1's last-step success that a last-step fraction over every env's
    episodes allows: the successes lie anywhere among the episodes, so envs 0 and 1 hold at least
    those the other envs cannot and at most as many as they have episodes.

    :param last_step: successful fraction of all ``sum(quota)`` episodes
    :param quota: episodes per env
    """
    if len(quota) < AUTHORS_ENVS or not math.isfinite(last_step):
        return NAN, NAN
    total, ours = sum(quota), sum(quota[:AUTHORS_ENVS])
    n = round(last_step * total)
    return max(0, n - (total - ours)) / ours, min(ours, n) / ours


def _own_point(curve: dict[str, list], end: int, any_step: float) -> float:
    """``success_last`` of the evaluation at the segment's end, the one ``own_success`` holds
    (NaN where the curve has no such point, or its any-step value is not ``own_success``'s)."""
    steps, last, succ = curve.get("steps", []), curve.get("success_last", []), curve.get("success", [])
    for k in range(len(steps) - 1, -1, -1):
        if steps[k] == end and k < len(last) and last[k] is not None and succ[k] == any_step:
            return float(last[k])
    return NAN


def _authors(entry: Any) -> float:
    values = (entry or {}).get("success_last") or []
    return float(np.mean(values[:AUTHORS_ENVS])) if len(values) >= AUTHORS_ENVS else NAN


def run_readings(run: Run) -> Readings:
    """The readings of one run, from its ``results.json`` and ``config.json``."""
    data = json.loads((run.path / "results.json").read_text())
    n = len(run.tasks)
    train_view = run.rules.get("eval_positions") in TRAIN_VIEWS
    curves, per_env = data.get("eval_curves") or {}, list(data.get("own_per_env") or [])
    per_env += [None] * (n - len(per_env))
    last = [
        _own_point(curves.get(task, {}), run.segments[i][1], run.own[i]) if i < len(run.segments) and math.isfinite(run.own[i]) else NAN
        for i, task in enumerate(run.tasks)
    ]
    authors = [_authors(e) if train_view else NAN for e in per_env[:n]]
    try:
        ev = json.loads((run.path / "config.json").read_text())["eval"]
        quota = episodes_per_env(int(ev["matrix_episodes"]), int(ev["n_envs"]))
    except (OSError, ValueError, KeyError, TypeError):
        quota = []
    bounds = [authors_bounds(v, quota) if train_view and not math.isfinite(a) else (NAN, NAN) for v, a in zip(last, authors)]
    heldout = run.heldout or (NAN,) * n
    return Readings(run.own, tuple(last), tuple(authors), tuple(b[0] for b in bounds), tuple(b[1] for b in bounds), tuple(heldout))


def _run_mean(values: tuple[float, ...]) -> float:
    """A run's task average; NaN unless every task has a value."""
    return float(np.mean(values)) if values and all(math.isfinite(v) for v in values) else NAN


def _cell(ms: MeanStd) -> str:
    return "—" if ms.n == 0 else f"{fmt_ms(ms)} ({ms.n})"


def readings_table(suite: str, algo: str, protocol: str, by_method: dict[str, tuple[Run, ...]], methods: Sequence[str]) -> Table | None:
    """Methods × readings: each reading's task average, mean ± std over the seeds that have it
    for every task (their count in brackets); None when no run evaluated on training positions."""
    rows = []
    for m in methods:
        runs = [r for r in by_method[m] if r.rules.get("eval_positions") in TRAIN_VIEWS]
        if not runs:
            continue
        per_run = [run_readings(r) for r in runs]
        ms = {f: mean_std([_run_mean(getattr(x, f)) for x in per_run]) for f in Readings._fields}
        low, high = ms["authors_low"], ms["authors_high"]
        exact = sum(x.authors_low == x.authors_high and math.isfinite(_run_mean(x.authors_low)) for x in per_run)
        bounds = "—" if low.n == 0 else f"{fmt(low.mean)} to {fmt(high.mean)} ({low.n}; exact in {exact})"
        rows.append((m, _cell(ms["any_step"]), _cell(ms["last_step"]), _cell(ms["authors"]), bounds, _cell(ms["heldout"])))
    if not rows:
        return None
    header = ("method", "ours: any step, training positions", "last step, training positions", "authors': last step, envs 0–1", "authors': bounds where not recorded", "held-out positions")
    caption = (
        f"{suite} / {algo} / {protocol.upper()}: own-segment success under each reading, the task average, mean ± std over "
        "the seeds that have the reading for every task (how many in brackets). The authors' reading needs each env's score "
        "(results.json's own_per_env), which earlier runs did not record: for them the last-step fraction over all the "
        "training positions' episodes only bounds it (the mean over seeds of each run's least and most possible value; "
        "exact: the runs whose every task has its bounds meet, its last-step episodes all successful or all failed)"
    )
    return Table(header, tuple(rows), caption)
