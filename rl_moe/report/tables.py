"""Per-task success tables (SPHERE paper Tables 13-17), RL vs CRL gaps, CL metrics, robust aggregates."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from rl_moe.continual.metrics import CLMetrics, ft_tasks
from rl_moe.report.loading import RunSet
from rl_moe.report.runs import Run
from rl_moe.report.paper import PAPER_STEPS_PER_TASK, paper_cells
from rl_moe.report.render import Table
from rl_moe.report.stats import (
    Interval,
    MeanStd,
    cl_metrics,
    fmt,
    fmt_ci,
    fmt_ms,
    iqm_ci,
    mean_ci,
    mean_std,
    probability_of_improvement_ci,
    task_auc,
)

class Field(NamedTuple):
    """A success field of :class:`~rl_moe.report.runs.Run`: what its per-task table shows, and
    the short name of what the robust tables aggregate."""

    table: str
    short: str


FIELDS = {
    "own": Field("success right after each task's own segment", "own-segment success"),
    "final": Field("final-checkpoint success", "final-checkpoint success"),
    "heldout": Field("own-task success of each task's checkpoint on held-out positions", "held-out own-task success"),
}


class PerTask(NamedTuple):
    """Mean ± std over seeds per task, and of the per-seed task average."""

    cells: tuple[MeanStd, ...]
    average: MeanStd


class Context(NamedTuple):
    """Runs of one (suite, algo): protocol -> method -> seeds."""

    suite: str
    algo: str
    tasks: tuple[str, ...]
    steps_per_task: int
    runs: dict[str, dict[str, tuple[Run, ...]]]
    rules: dict[str, Any]


def contexts(runset: RunSet) -> list[Context]:
    """Group a run set by (suite, algo)."""
    out: dict[tuple[str, str], Context] = {}
    for key, runs in runset.groups.items():
        ctx = out.setdefault((key.suite, key.algo), Context(key.suite, key.algo, runs[0].tasks, runs[0].steps_per_task, {}, runs[0].rules))
        ctx.runs.setdefault(key.protocol, {})[key.method] = runs
    return list(out.values())


def method_order(methods: Sequence[str], baseline: str, method: str) -> list[str]:
    """Baseline first, then the compared method, then the rest alphabetically."""
    first = [m for m in (baseline, method) if m in methods]
    return first + sorted(m for m in methods if m not in first)


def seed_matrix(runs: Sequence[Run], field: str = "own") -> np.ndarray:
    """(seeds, tasks) success matrix of ``field`` (a key of :data:`FIELDS`), NaN where not evaluated."""
    if field not in FIELDS:
        raise ValueError(f"unknown success field {field!r}; valid choices: {', '.join(FIELDS)}")
    nan = (float("nan"),)
    return np.array([getattr(r, field) or nan * len(r.tasks) for r in runs], dtype=float).reshape(len(runs), len(runs[0].tasks) if runs else 0)


def per_task(runs: Sequence[Run], field: str = "own") -> PerTask:
    """Mean ± std over seeds per task; the average row is over seeds of each seed's task mean.

    A seed with a missing task contributes to that task's other cells but not to the average.
    """
    m = seed_matrix(runs, field)  # (R, T)
    cells = tuple(mean_std(m[:, j]) for j in range(m.shape[1]))
    seed_avg = np.where(np.isfinite(m).all(axis=1), np.nanmean(np.where(np.isfinite(m), m, 0.0), axis=1), np.nan)
    return PerTask(cells, mean_std(seed_avg))


def budget_note(steps_per_task: int) -> str:
    """Our runs' budget beside the paper's, flagged where it is smaller (not comparable)."""
    note = f"{steps_per_task:,} steps per task (paper: {PAPER_STEPS_PER_TASK:,})"
    # PPO rounds a 1M budget up to whole rollouts (1,015,808), never down.
    return note if steps_per_task >= PAPER_STEPS_PER_TASK else f"**{note}: below the paper's budget, not comparable**"


def scored(runs: Sequence[Run], field: str) -> list[Run]:
    """The runs with at least one task scored in ``field`` (every run for own success, which
    counts incomplete runs in the cells they evaluated; the runs with ``positions-<N>.json`` for held-out)."""
    return list(runs) if field != "heldout" else [r for r in runs if np.isfinite(r.heldout).any()]


def heldout_note(by_method: Mapping[str, Sequence[Run]]) -> str:
    """How many held-out positions the scored runs used ("25 held-out positions")."""
    counts = sorted({r.heldout_positions for runs in by_method.values() for r in scored(runs, "heldout")})
    return f"{' or '.join(map(str, counts))} held-out positions per task besides the training ones, scored by python -m rl_moe.positions"


def _seeds_label(runs: Sequence[Run]) -> str:
    return f"(n={len(runs)})"


def success_table(ctx: Context, protocol: str, field: str, baseline: str, method: str) -> Table | None:
    """Tasks × methods table of mean ± std success under one protocol (Tables 13-16 layout)."""
    by_method = {m: r for m, runs in ctx.runs.get(protocol, {}).items() if (r := scored(runs, field))}
    if not by_method:
        return None
    methods = method_order(list(by_method), baseline, method)
    stats = {m: per_task(by_method[m], field) for m in methods}
    # The paper's columns (Tables 13-14) sit next to the measured ones where it reports every task.
    paper = {m: cells for m in methods if field == "own" and (cells := paper_cells(protocol, m, ctx.tasks)) is not None}
    rows = [
        (task, *(fmt_ms(stats[m].cells[j]) for m in methods), *(fmt_ms(cells[j]) for cells in paper.values()))
        for j, task in enumerate(ctx.tasks)
    ]
    rows.append(("average", *(fmt_ms(stats[m].average) for m in methods), *(fmt_ms(cells[-1]) for cells in paper.values())))
    header = ("task", *(f"{m} {_seeds_label(by_method[m])}" for m in methods), *(f"paper: {m} (n=5)" for m in paper))
    caption = f"{ctx.suite} / {ctx.algo} / {protocol.upper()}: {FIELDS[field].table} (mean ± std over seeds)"
    if field == "heldout":
        caption += f"; {heldout_note(by_method)}; n counts only the seeds scored"
    if paper:
        caption += f"; paper: SPHERE Table {13 if protocol == 'rl' else 14}; {budget_note(ctx.steps_per_task)}"
    return Table(header, tuple(rows), caption)


class Gap(NamedTuple):
    """Per-task and average means under RL and CRL, and the RL − CRL gap."""

    rl: tuple[float, ...]
    crl: tuple[float, ...]
    gap: tuple[float, ...]
    rl_avg: float
    crl_avg: float
    gap_avg: float


def rl_crl_gap(rl_runs: Sequence[Run], crl_runs: Sequence[Run]) -> Gap:
    """RL − CRL gap of the seed-mean own-segment success, per task and for the average."""
    rl, crl = per_task(rl_runs), per_task(crl_runs)
    rl_m = tuple(c.mean for c in rl.cells)
    crl_m = tuple(c.mean for c in crl.cells)
    return Gap(rl_m, crl_m, tuple(a - b for a, b in zip(rl_m, crl_m)), rl.average.mean, crl.average.mean, rl.average.mean - crl.average.mean)


def gap_methods(ctx: Context, baseline: str, method: str) -> list[str]:
    """Methods that have both RL and CRL runs in this context."""
    both = set(ctx.runs.get("rl", {})) & set(ctx.runs.get("crl", {}))
    return method_order(sorted(both), baseline, method)


def gap_table(ctx: Context, baseline: str, method: str) -> Table | None:
    """Per task: RL, CRL and RL − CRL for each method with both protocols."""
    methods = gap_methods(ctx, baseline, method)
    if not methods:
        return None
    gaps = {m: rl_crl_gap(ctx.runs["rl"][m], ctx.runs["crl"][m]) for m in methods}
    header = ("task", *(f"{m} {col}" for m in methods for col in ("RL", "CRL", "RL−CRL")))
    rows = [(task, *(fmt(v) for m in methods for v in (gaps[m].rl[j], gaps[m].crl[j], gaps[m].gap[j]))) for j, task in enumerate(ctx.tasks)]
    rows.append(("average", *(fmt(v) for m in methods for v in (gaps[m].rl_avg, gaps[m].crl_avg, gaps[m].gap_avg))))
    return Table(header, tuple(rows), f"{ctx.suite} / {ctx.algo}: RL vs CRL success per task (seed means) and the RL−CRL gap")


def segment_aucs(run: Run, tasks: Sequence[str]) -> np.ndarray:
    """(T,) AUC of each of ``tasks`` over its own segment in ``run``; NaN for a task the run has not
    trained or evaluated (a partial reference run serves the tasks it finished)."""
    out = []
    for t in tasks:
        i = run.tasks.index(t) if t in run.tasks else None
        curve = run.eval_curves.get(t)
        out.append(float("nan") if i is None or curve is None else task_auc(*curve, run.segment_start(i), run.segment_length(i)))
    return np.array(out, dtype=float)


def _same_seed_reference(run: Run, references: Sequence[Run]) -> np.ndarray | None:
    ref = next((r for r in references if r.seed == run.seed), None)
    return None if ref is None else segment_aucs(ref, run.tasks)


def _mean_reference(run: Run, references: Sequence[Run]) -> np.ndarray | None:
    if not references:
        return None
    aucs = np.stack([segment_aucs(r, run.tasks) for r in references])
    seen = np.isfinite(aucs)
    count = seen.sum(axis=0)
    return np.where(count > 0, np.where(seen, aucs, 0.0).sum(axis=0) / np.maximum(count, 1), np.nan)


class FTReference(NamedTuple):
    """A rule giving a CRL run the per-task reference AUCs of its forward transfer."""

    aucs: Callable[[Run, Sequence[Run]], np.ndarray | None]
    caption: str


#: How a CRL run's forward transfer finds its reference AUCs among the method's RL runs:
#: ``seed`` takes the RL run of the same seed; ``mean`` averages each task's AUC over every RL run
#: of the method that evaluated it (one reference per task, as Continual World reports it), so one
#: reference run serves all seeds and a partial one serves the tasks it finished.
FT_REFERENCES = {
    "seed": FTReference(_same_seed_reference, "the RL run of the same seed"),
    "mean": FTReference(_mean_reference, "each task's AUC averaged over the method's RL runs"),
}


def ft_aucs(run: Run, references: Sequence[Run], rule: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(the run's, the reference's) per-task AUCs for forward transfer, None without a reference.

    :param references: the method's RL runs
    :param rule: a key of :data:`FT_REFERENCES` (how the RL runs give each task's reference AUC)
    """
    if rule not in FT_REFERENCES:
        raise ValueError(f"unknown forward-transfer reference {rule!r}; valid choices: {', '.join(FT_REFERENCES)}")
    ref = FT_REFERENCES[rule].aucs(run, references)
    return None if ref is None else (segment_aucs(run, run.tasks), ref)


def run_cl_metrics(run: Run, references: Sequence[Run], rule: str = "seed") -> CLMetrics:
    """Continual World metrics of a CRL run; forward transfer against its RL reference (:func:`ft_aucs`).

    Without a reference, the run's own stored forward transfer is used when it has one.
    """
    aucs = ft_aucs(run, references, rule)
    metrics = cl_metrics(np.array(run.own), np.array(run.final), *(aucs or (None, None)))
    stored = run.stored_cl.get("forward_transfer")
    if aucs is None and stored is not None:
        metrics = metrics._replace(forward_transfer=float(stored))
    return metrics


def reference_tasks(run: Run, references: Sequence[Run], rule: str) -> int:
    """How many of ``run``'s tasks enter its forward transfer under ``rule`` (:func:`~rl_moe.continual.metrics.ft_tasks`)."""
    aucs = ft_aucs(run, references, rule)
    return 0 if aucs is None else int(ft_tasks(*aucs).sum())


def cl_table(ctx: Context, baseline: str, method: str, rule: str = "seed") -> Table | None:
    """Average performance, forgetting and forward transfer (mean ± std over complete CRL seeds)."""
    crl = ctx.runs.get("crl", {})
    rl = ctx.runs.get("rl", {})
    rows = []
    for m in method_order(list(crl), baseline, method):
        runs = [r for r in crl[m] if r.complete]
        if not runs:
            continue
        refs = rl.get(m, ())
        metrics = [run_cl_metrics(r, refs, rule) for r in runs]
        cols = [fmt_ms(mean_std(list(values))) for values in zip(*metrics)]  # one per CLMetrics field
        counts = [reference_tasks(r, refs, rule) for r in runs]
        span = str(counts[0]) if min(counts) == max(counts) else f"{min(counts)}–{max(counts)}"
        rows.append((f"{m} (n={len(metrics)})", *cols, span))
    if not rows:
        return None
    header = ("method", "average performance ↑", "forgetting ↓", "forward transfer ↑", f"tasks with a reference (of {len(ctx.tasks)})")
    how = FT_REFERENCES[rule].caption
    return Table(header, tuple(rows), f"{ctx.suite} / {ctx.algo}: Continual World metrics (complete CRL runs; forward transfer against {how})")


class Robust(NamedTuple):
    """Robust aggregates of one method: IQM and mean with CIs, P(method > baseline)."""

    n_runs: int
    iqm: Interval
    mean: Interval
    poi: Interval | None


def complete_scores(runs: Sequence[Run], field: str = "own") -> np.ndarray:
    """(R, T) success in ``field`` of the runs with every task evaluated."""
    m = seed_matrix(runs, field)
    return m[np.isfinite(m).all(axis=1)]


def robust(ctx: Context, protocol: str, baseline: str, reps: int, seed: int = 0, field: str = "own") -> dict[str, Robust]:
    """IQM and mean with stratified-bootstrap CIs per method; probability of improvement over ``baseline``."""
    by_method = ctx.runs.get(protocol, {})
    base = complete_scores(by_method[baseline], field) if baseline in by_method else np.empty((0, 0))
    out = {}
    for m, runs in by_method.items():
        s = complete_scores(runs, field)
        if s.shape[0] == 0:
            continue
        poi = None
        if m != baseline and base.shape[0]:
            poi = probability_of_improvement_ci(s, base, reps=reps, seed=seed)
        out[m] = Robust(s.shape[0], iqm_ci(s, reps=reps, seed=seed), mean_ci(s, reps=reps, seed=seed), poi)
    return out


def robust_table(ctx: Context, protocol: str, baseline: str, method: str, reps: int, field: str = "own") -> Table | None:
    """Robust aggregates table of one protocol (95% stratified-bootstrap CIs)."""
    res = robust(ctx, protocol, baseline, reps, field=field)
    if not res:
        return None

    def ci(x: Interval | None) -> str:
        return "—" if x is None else fmt_ci(x)

    rows = tuple((m, str(res[m].n_runs), ci(res[m].iqm), ci(res[m].mean), ci(res[m].poi)) for m in method_order(list(res), baseline, method))
    header = ("method", "runs", "IQM [95% CI]", "mean [95% CI]", f"P(method > {baseline}) [95% CI]")
    caption = f"{ctx.suite} / {ctx.algo} / {protocol.upper()}: robust aggregates of {aggregated(ctx.runs.get(protocol, {}), field)} over runs × tasks"
    return Table(header, rows, caption)


def aggregated(by_method: Mapping[str, Sequence[Run]], field: str) -> str:
    """What a robust table aggregates, with the held-out positions it rests on."""
    if field != "heldout":
        return FIELDS[field].short
    return f"{FIELDS[field].short} ({heldout_note(by_method)})"


def summary_lines(ctx: Context, baseline: str, method: str) -> list[str]:
    """Headline numbers: relative improvement of ``method`` over ``baseline`` and the RL−CRL gap reduction."""
    lines = []
    for protocol in ("crl", "rl"):
        by_method = ctx.runs.get(protocol, {})
        if baseline in by_method and method in by_method:
            b, m = per_task(by_method[baseline]).average, per_task(by_method[method]).average
            rel = (m.mean - b.mean) / b.mean if b.mean else float("nan")
            lines.append(
                f"{ctx.suite} / {ctx.algo} / {protocol.upper()}: average success {method} {fmt_ms(m)} vs {baseline} {fmt_ms(b)} "
                f"(relative change {'—' if np.isnan(rel) else f'{100 * rel:+.0f}%'})."
            )
    if set(gap_methods(ctx, baseline, method)) >= {baseline, method}:
        gb = rl_crl_gap(ctx.runs["rl"][baseline], ctx.runs["crl"][baseline]).gap_avg
        gm = rl_crl_gap(ctx.runs["rl"][method], ctx.runs["crl"][method]).gap_avg
        red = 1 - gm / gb if gb else float("nan")
        lines.append(
            f"{ctx.suite} / {ctx.algo}: RL−CRL gap {method} {fmt(gm)} vs {baseline} {fmt(gb)} "
            f"(gap reduction {'—' if np.isnan(red) else f'{100 * red:.0f}%'})."
        )
    return lines


def incomplete_runs(runset: RunSet) -> list[str]:
    """Human-readable lines for runs that did not finish every task."""
    return [f"{r.path} ({sum(np.isfinite(r.own))}/{len(r.tasks)} tasks)" for r in runset.runs if not r.complete]
