"""Reading TensorBoard scalars of a run folder and aligning seeds on a common step grid."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rl_moe.tblog import quiet_tensorboard

EVENT_GLOB = "events.out.tfevents.*"
#: Core plasticity tags (docs/metrics.md), plotted by default.
PLASTICITY_TAGS = (
    "plasticity/entk_rank",
    "plasticity/entk_rank_online",
    "plasticity/feature_rank",
    "plasticity/feature_cond",
    "plasticity/dormant_ratio",
    "plasticity/dormant_ratio_online",
    "plasticity/idle_expert_fraction",
    "plasticity/feature_norm",
    "plasticity/grad_norm",
    "plasticity/active_units",
    "plasticity/feature_erank",
    "train/weight_change",
)
TAG_LABELS = {
    "plasticity/entk_rank": "eNTK effective rank $r_e(K)$ (held-out states)",
    "plasticity/entk_rank_online": "eNTK effective rank $r_e(K)$ (online rollout states)",
    "plasticity/dormant_ratio_online": r"dormant ratio ($\tau$=0.025, online rollout states)",
    "plasticity/idle_expert_fraction": "experts routed no held-out state",
    "plasticity/feature_rank": "feature effective rank $r_e(A_{last})$",
    "plasticity/feature_cond": r"feature condition number $\kappa(A_{last})$",
    "plasticity/dormant_ratio": r"dormant ratio ($\tau$=0.025)",
    "plasticity/feature_norm": "feature L2 norm",
    "plasticity/grad_norm": "actor gradient L2 norm",
    "plasticity/active_units": "active units (Plasticine)",
    "plasticity/feature_erank": "feature effective rank of the singular values (Plasticine)",
    "train/weight_change": "relative weight change per update (Plasticine)",
    "eval/success": "eval success (current task)",
}


class Curve(NamedTuple):
    """One scalar tag of one run: sorted unique steps (S,) and values (S,)."""

    steps: np.ndarray
    values: np.ndarray


class Band(NamedTuple):
    """Mean ± std over seeds on a common grid (G,); ``n`` seeds contributed."""

    grid: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    n: int


def event_dirs(run_dir: Path) -> list[Path]:
    """Folders under ``run_dir`` (itself included) that hold TensorBoard event files."""
    return sorted({f.parent for f in run_dir.rglob(EVENT_GLOB)})


def load_scalars(run_dir: Path, prefixes: tuple[str, ...] = ("plasticity/", "eval/")) -> dict[str, Curve]:
    """Scalars whose tag starts with one of ``prefixes``, merged over every event folder of the run.

    A resumed run may log a step twice; the value read last wins, as TensorBoard shows it.

    :param run_dir: the run folder
    :param prefixes: tag groups to keep
    """

    merged: dict[str, dict[int, float]] = {}
    for folder in event_dirs(run_dir):
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        with quiet_tensorboard():
            acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            if not tag.startswith(prefixes):
                continue
            points = merged.setdefault(tag, {})
            for ev in acc.Scalars(tag):
                points[int(ev.step)] = float(ev.value)
    out = {}
    for tag, points in merged.items():
        steps = np.array(sorted(points), dtype=float)
        out[tag] = Curve(steps, np.array([points[int(s)] for s in steps], dtype=float))
    return out


def seed_band(curves: list[Curve], n_points: int = 200) -> Band:
    """Interpolate each seed's curve onto a shared grid and take mean ± std (ddof=0) per point.

    The grid spans the steps that every seed covers (runs of unequal length are cut to the
    shortest), so a band never mixes in extrapolated values.

    :param curves: one curve per seed (non-empty)
    :param n_points: grid size
    """
    curves = [c for c in curves if c.steps.size]
    if not curves:
        return Band(np.empty(0), np.empty(0), np.empty(0), 0)
    lo = max(float(c.steps[0]) for c in curves)
    hi = min(float(c.steps[-1]) for c in curves)
    grid = np.linspace(lo, hi, n_points) if hi > lo else np.array([lo])
    stacked = np.stack([np.interp(grid, c.steps, c.values) for c in curves])  # (seeds, G)
    return Band(grid, stacked.mean(axis=0), stacked.std(axis=0), len(curves))
