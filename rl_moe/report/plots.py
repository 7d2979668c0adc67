"""Figures: plasticity curves with seed bands (SPHERE paper Figure 3) and success over tasks.

Needs matplotlib (the ``report`` extra).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: the report never opens a window
import matplotlib.pyplot as plt
import numpy as np

from rl_moe.report.runs import Run
from rl_moe.report.scalars import Curve, seed_band
from rl_moe.report.tables import Context, per_task


def slug(*parts: str) -> str:
    """A file-name-safe name from parts."""
    return "_".join(re.sub(r"[^A-Za-z0-9._-]+", "-", p).strip("-") for p in parts)


#: A task switch: the global step where a task starts, and its name.
Boundary = tuple[float, str]


def _task_boundaries(ax: plt.Axes, boundaries: Sequence[Boundary], xmax: float, names: bool = True) -> None:
    """A dashed line at each task switch, with the name of the task it starts along it (``names``:
    on this axis; a stacked figure names them on its top panel only)."""
    for x, task in boundaries:
        if x < xmax:
            ax.axvline(x, color="0.8", lw=0.8, ls="--", zorder=0)
            if names:
                ax.text(x, 0.98, f" {task}", transform=ax.get_xaxis_transform(), rotation=90, va="top", ha="left", fontsize=7, color="0.45")


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def axis_for(tag: str) -> dict[str, object]:
    """:func:`plot_bands` axis options of a tag: success in [0, 1]; condition numbers, which span
    orders of magnitude, on a log axis."""
    if tag.endswith("success"):
        return {"ylim": (0.0, 1.0)}
    if "cond" in tag:
        return {"log": True}
    return {}


def plot_bands(
    curves: dict[str, list[Curve]],
    title: str,
    ylabel: str,
    path: Path,
    boundaries: Sequence[Boundary],
    ylim: tuple[float, float] | None = None,
    log: bool = False,
) -> Path | None:
    """One line per method with a mean ± std band over seeds; dashed lines mark task boundaries.

    :param curves: method -> one curve per seed
    :param title: figure title
    :param ylabel: y-axis label
    :param path: PNG to write
    :param boundaries: (global step, task name) where each task after the first starts
    :param ylim: fixed y range (the band is clipped to it)
    :param log: log-scaled y axis (the band is drawn in log space: mean ± std of log10 values)
    """
    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    xmax = _draw_bands(ax, curves, ylim, log)
    if xmax is None:
        plt.close(fig)
        return None
    _task_boundaries(ax, boundaries, xmax)
    ax.set_xlabel("environment steps")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return _save(fig, path)


def plot_stacked(
    panels: Sequence[tuple[dict[str, list[Curve]], str, dict[str, object]]],
    title: str,
    path: Path,
    boundaries: Sequence[Boundary],
) -> Path | None:
    """Panels stacked over one step axis (success above r_e(K), as the SPHERE paper's Figure 3
    reads them together), each as :func:`plot_bands`; None unless every panel has a curve.

    :param panels: (method -> curves, y label, :func:`axis_for` options) per panel, top first
    """
    fig, axes = plt.subplots(len(panels), 1, figsize=(7.5, 3.0 * len(panels) + 0.6), sharex=True, squeeze=False)
    ends = [_draw_bands(ax, curves, **opts) for ax, (curves, _, opts) in zip(axes[:, 0], panels)]  # type: ignore[arg-type]
    if any(end is None for end in ends):
        plt.close(fig)
        return None
    for k, (ax, (_, ylabel, _)) in enumerate(zip(axes[:, 0], panels)):
        _task_boundaries(ax, boundaries, max(ends), names=k == 0)  # type: ignore[type-var]
        ax.set_ylabel(ylabel)
    axes[-1, 0].set_xlabel("environment steps")
    axes[0, 0].set_title(title)
    return _save(fig, path)


def _draw_bands(ax: plt.Axes, curves: dict[str, list[Curve]], ylim: tuple[float, float] | None = None, log: bool = False) -> float | None:
    """Draw one mean ± std band per method on ``ax``; the last step drawn, None if no curve."""
    if log:  # a band over orders of magnitude is only meaningful in log space
        curves = {m: [Curve(c.steps, np.log10(np.maximum(c.values, 1e-300))) for c in cs] for m, cs in curves.items()}
    bands = {m: seed_band(c) for m, c in curves.items()}
    bands = {m: b for m, b in bands.items() if b.n}
    if not bands:
        return None
    xmax = 0.0
    for m, b in bands.items():
        mean, lo, hi = b.mean, b.mean - b.std, b.mean + b.std
        if log:
            mean, lo, hi = 10.0**mean, 10.0**lo, 10.0**hi
        if ylim is not None:
            lo, hi = np.clip(lo, *ylim), np.clip(hi, *ylim)
        (line,) = ax.plot(b.grid, mean, label=f"{m} (n={b.n})", lw=1.6)
        ax.fill_between(b.grid, lo, hi, color=line.get_color(), alpha=0.2, lw=0)
        xmax = max(xmax, float(b.grid[-1]))
    if log:
        ax.set_yscale("log")
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return xmax


def eval_curve(run: Run) -> Curve:
    """The run's periodic current-task evaluations as one curve over global steps.

    At a task boundary the finished task's last evaluation and the next task's step-0 one share a
    step; ordering ties by task keeps the curve's drop at the boundary (sorting by value would draw
    the new task's 0 first and the old task's success after it).
    """
    pts = sorted(
        (s, order, v) for order, (steps, vals) in enumerate(run.eval_curves.values()) for s, v in zip(steps, vals) if np.isfinite(v)
    )
    if not pts:
        return Curve(np.empty(0), np.empty(0))
    arr = np.array(pts)
    return Curve(arr[:, 0], arr[:, 2])


def plot_expert_usage(rows: Sequence[tuple[str, dict]], path: Path) -> Path | None:
    """One row of panels per run (its label, its ``experts.json``; :mod:`rl_moe.experts`): after
    each task, a tasks x experts heatmap of the routed shares on each task's states, and last,
    a tasks x experts heatmap of how far each task moved each expert's weights."""
    rows = [(label, d) for label, d in rows if d.get("shares")]
    if not rows:
        return None
    n_ckpt = max(len(d["shares"]) for _, d in rows)
    fig, axes = plt.subplots(len(rows), n_ckpt + 1, figsize=(2.3 * (n_ckpt + 1) + 0.8, 1.9 * len(rows) + 1.4), squeeze=False)
    shares_img = moved_img = None
    for r, (label, d) in enumerate(rows):
        tasks = [t.removesuffix("-v3") for t in d["tasks"]]
        for c in range(n_ckpt):
            ax = axes[r, c]
            if c < len(d["shares"]):
                shares_img = ax.imshow(np.array(d["shares"][c], dtype=float), vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
                if r == 0:
                    ax.set_title(f"after task {c + 1}", fontsize=8)
            ax.set_yticks(range(len(tasks)), tasks if c == 0 else [""] * len(tasks), fontsize=7)
            ax.set_xticks([])
        e = int(d["n_experts"])
        moved = np.array([m if m is not None else [np.nan] * e for m in d["movement"]], dtype=float)
        ax = axes[r, -1]
        moved_img = ax.imshow(moved, cmap="magma", aspect="auto", vmin=0.0)
        if r == 0:
            ax.set_title("weights moved while\neach task trained", fontsize=8)
        ax.set_yticks(range(len(moved)), [""] * len(moved))  # the rows are the tasks, as on the left
        ax.set_xticks([])
        axes[r, 0].set_ylabel(label, fontsize=8)
    for ax in axes[-1, :]:
        ax.set_xlabel("expert", fontsize=7)
    if shares_img is not None:
        fig.colorbar(shares_img, ax=list(axes[:, :-1].ravel()), location="bottom", shrink=0.6, pad=0.12, label="share of routed rows")
    if moved_img is not None:
        fig.colorbar(moved_img, ax=list(axes[:, -1]), location="bottom", shrink=0.9, pad=0.12, label="relative change of its weights")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_success(ctx: Context, protocol: str, methods: Sequence[str], path: Path) -> Path | None:
    """Per-task success (mean ± std over seeds) after each task's own segment; dashed = final checkpoint."""
    by_method = ctx.runs.get(protocol, {})
    methods = [m for m in methods if m in by_method]
    if not methods:
        return None
    x = np.arange(len(ctx.tasks))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.7 * len(x) + 2), 4.2))
    width = 0.8 / len(methods)
    for k, m in enumerate(methods):
        own = per_task(by_method[m], "own")
        mean = np.array([c.mean for c in own.cells])
        std = np.array([c.std for c in own.cells])
        xs = x - 0.4 + width * (k + 0.5)
        ax.bar(xs, mean, width, yerr=std, capsize=2, label=f"{m} own segment", alpha=0.85)
        if protocol == "crl":
            final = np.array([c.mean for c in per_task(by_method[m], "final").cells])
            if np.isfinite(final).any():
                # a black bar-wide tick per task: the final checkpoint's success on that task
                ax.scatter(xs, final, marker="_", s=900 * width, color="k", zorder=3, label="final checkpoint" if k == 0 else None)
    ax.set_xticks(x, ctx.tasks, rotation=35, ha="right", fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.set_ylabel("success")
    ax.set_title(f"{ctx.suite} / {ctx.algo} / {protocol.upper()}: success per task")
    # Outside the axes: success stays on [0, 1] with no room left above the bars.
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)
