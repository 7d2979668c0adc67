"""Assembling the report: tables, robust aggregates, CL metrics and figures into report.md/.html."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rl_moe.cli import reraise_interrupt
from rl_moe.report.collapse import TAGS as COLLAPSE_TAGS
from rl_moe.report.collapse import collapse_table
from rl_moe.report.grouping import describe_network, describe_rules
from rl_moe.report.loading import RunSet, load_runs, read_experts
from rl_moe.report.runs import ReportError
from rl_moe.report.plasticity import TAGS as DIAGNOSTIC_TAGS
from rl_moe.report.plasticity import plasticity_table
from rl_moe.report.readings import readings_table
from rl_moe.report.render import Block, Heading, Image, Paragraph, to_html, to_markdown
from rl_moe.report.scalars import PLASTICITY_TAGS, TAG_LABELS, Curve, load_scalars
from rl_moe.report.separation import separation_table
from rl_moe.report.stats import VERDICT_REPS
from rl_moe.report.tables import (
    Context,
    cl_table,
    contexts,
    gap_table,
    incomplete_runs,
    method_order,
    robust_table,
    success_table,
    summary_lines,
)

#: The plasticity metric drawn under success: the eNTK effective rank r_e(K) (SPHERE, Sec. 3).
RANK_TAG = "plasticity/entk_rank"

MISSING_MATPLOTLIB = "Figures skipped: matplotlib is not installed (pip install 'rl_moe[report]')."


@dataclass(frozen=True)
class ReportOptions:
    """What to compare and how.

    :param baseline: the reference method of comparisons (the paper's Top-K MoE)
    :param method: the method compared against it (the paper's SPHERE)
    :param reps: bootstrap replicas for confidence intervals
    :param plasticity_tags: TensorBoard tags plotted with seed bands
    :param ft_reference: how forward transfer finds its reference, a key of
        :data:`~rl_moe.report.tables.FT_REFERENCES`
    """

    baseline: str = "topk"
    method: str = "sphere"
    reps: int = 10_000
    plasticity_tags: tuple[str, ...] = PLASTICITY_TAGS
    ft_reference: str = "seed"


@dataclass(frozen=True)
class ReportFiles:
    """Paths written by :func:`build_report`."""

    markdown: Path
    html: Path
    figures: tuple[Path, ...]


def _figures(ctx: Context, opts: ReportOptions, out: Path, scalars: dict[Path, dict[str, Curve]]) -> list[Block]:
    try:
        from rl_moe.report.plots import axis_for, eval_curve, plot_bands, plot_expert_usage, plot_stacked, plot_success, slug  # lazy: plots need matplotlib (the report extra)
    except ImportError as exc:
        reraise_interrupt(exc)
        return [Paragraph(MISSING_MATPLOTLIB)]
    blocks: list[Block] = []
    for protocol, by_method in ctx.runs.items():
        methods = method_order(list(by_method), opts.baseline, opts.method)
        first = next(iter(by_method.values()))[0]
        bounds = [(first.segment_start(i), ctx.tasks[i]) for i in range(1, len(ctx.tasks))]
        name = slug("success", ctx.suite, ctx.algo, protocol) + ".png"
        if plot_success(ctx, protocol, methods, out / name):
            blocks.append(Image(name, f"{ctx.suite} / {ctx.algo} / {protocol.upper()}: success per task (bars: own segment, mean ± std; black ticks: final checkpoint)"))
        curves = {m: [eval_curve(r) for r in by_method[m]] for m in methods}
        name = slug("eval", ctx.suite, ctx.algo, protocol) + ".png"
        title = f"{ctx.suite} / {ctx.algo} / {protocol.upper()}: current-task success over training"
        if plot_bands(curves, title, TAG_LABELS["eval/success"], out / name, bounds, **axis_for("eval/success")):
            blocks.append(Image(name, title + " (mean ± std over seeds)"))
        ranks = {m: [scalars[r.path][RANK_TAG] for r in by_method[m] if RANK_TAG in scalars[r.path]] for m in methods}
        name = slug("success-and-entk_rank", ctx.suite, ctx.algo, protocol) + ".png"
        title = f"{ctx.suite} / {ctx.algo} / {protocol.upper()}: success and r_e(K) over training"
        panels = [(curves, TAG_LABELS["eval/success"], axis_for("eval/success")), (ranks, TAG_LABELS.get(RANK_TAG, RANK_TAG), axis_for(RANK_TAG))]
        if plot_stacked(panels, title, out / name, bounds):
            blocks.append(Image(name, title + " (top: current-task success; bottom: eNTK effective rank; mean ± std over seeds; dashed lines: task switches, named by the task they start)"))
        usage = [(f"{m}, seed {r.seed}", data) for m in methods for r in by_method[m][:1] if (data := read_experts(r.path)) is not None]
        name = slug("experts", ctx.suite, ctx.algo, protocol) + ".png"
        if plot_expert_usage(usage, out / name):
            blocks.append(Image(name, f"{ctx.suite} / {ctx.algo} / {protocol.upper()}: the experts each task uses. Each row is one run, its method's lowest seed "
                                "with `experts.json` (`python -m rl_moe.experts`; experts are not matched across seeds). Left: after each task, the share of routed "
                                "rows each expert (column) receives on each task's states (row); a later task taking over the experts an earlier one used shows as "
                                "that earlier row's bright cells moving. Right: how far each expert's weights moved while each task (row) trained."))  # fmt: skip
        for tag in opts.plasticity_tags:
            curves = {m: [scalars[r.path][tag] for r in by_method[m] if tag in scalars[r.path]] for m in methods}
            name = slug(tag.replace("/", "-"), ctx.suite, ctx.algo, protocol) + ".png"
            title = f"{ctx.suite} / {ctx.algo} / {protocol.upper()}: {tag}"
            if plot_bands(curves, title, TAG_LABELS.get(tag, tag), out / name, bounds, **axis_for(tag)):
                blocks.append(Image(name, title + " over training (mean ± std over seeds; dashed lines: task switches, named by the task they start)"))
    return blocks


def report_blocks(runset: RunSet, opts: ReportOptions, out: Path) -> list[Block]:
    """Every section of the report; figures are written into ``out`` as a side effect."""
    scalars = {r.path: load_scalars(r.path, prefixes=(*opts.plasticity_tags, *COLLAPSE_TAGS, *DIAGNOSTIC_TAGS)) for r in runset.runs}
    blocks: list[Block] = [Heading("rl_moe report", 1)]
    n_runs = len(runset.runs)
    blocks.append(Paragraph(f"{n_runs} runs in {len(runset.groups)} groups (suite / algo / method / protocol). Standard deviations are over seeds (ddof=0); CIs are 95% percentile intervals of a bootstrap over runs stratified by task ({opts.reps} replicas; at least {VERDICT_REPS:,} for the separation tables' differences)."))
    for ctx in contexts(runset):
        blocks.append(Heading(f"{ctx.suite} / {ctx.algo}", 2))
        blocks.append(Paragraph(f"Protocol: {describe_rules(ctx.rules)}."))
        blocks.append(Paragraph(f"Network: {describe_network(r for by_method in ctx.runs.values() for runs in by_method.values() for r in runs)}."))
        blocks.extend(Paragraph(line) for line in summary_lines(ctx, opts.baseline, opts.method))
        blocks.append(Heading("Per-task success", 3))
        for protocol, field in (("rl", "own"), ("crl", "own"), ("rl", "heldout"), ("crl", "heldout")):
            table = success_table(ctx, protocol, field, opts.baseline, opts.method)
            if table:
                blocks.append(table)
        table = gap_table(ctx, opts.baseline, opts.method)
        if table:
            blocks.append(table)
        table = success_table(ctx, "crl", "final", opts.baseline, opts.method)
        if table:
            blocks.append(table)
        readings = [t for protocol, by_method in ctx.runs.items() if (t := readings_table(ctx.suite, ctx.algo, protocol, by_method, method_order(list(by_method), opts.baseline, opts.method)))]
        if readings:
            blocks.append(Heading("Success readings", 3))
            blocks.extend(readings)
        blocks.append(Heading("Robust aggregates", 3))
        for protocol, field in (("rl", "own"), ("crl", "own"), ("rl", "heldout"), ("crl", "heldout")):
            table = robust_table(ctx, protocol, opts.baseline, opts.method, opts.reps, field)
            if table:
                blocks.append(table)
            table = separation_table(ctx, protocol, opts.baseline, opts.method, opts.reps, field)
            if table:
                blocks.append(table)
        table = cl_table(ctx, opts.baseline, opts.method, opts.ft_reference)
        if table:
            blocks.append(Heading("Continual World metrics", 3))
            blocks.append(table)
        table = collapse_table(ctx, scalars, opts.baseline, opts.method)
        if table:
            blocks.append(Heading("Collapse and action box", 3))
            blocks.append(table)
        diagnostics = [t for protocol in ctx.runs if (t := plasticity_table(ctx, protocol, scalars, opts.baseline, opts.method, opts.reps))]
        if diagnostics:
            blocks.append(Heading("Plasticity against the baseline", 3))
            blocks.extend(diagnostics)
        blocks.append(Heading("Figures", 3))
        blocks.extend(_figures(ctx, opts, out, scalars))
    notes = incomplete_runs(runset) + [f"{p}: left out, {why}" for p, why in runset.dropped]
    if notes or runset.heldout_notes:
        blocks.append(Heading("Notes", 2))
    if notes:
        blocks.append(Paragraph("Incomplete or left-out runs (incomplete runs count only in the per-task cells they evaluated):"))
        blocks.extend(Paragraph(f"- {n}") for n in notes)
    if runset.heldout_notes:
        blocks.append(Paragraph("Held-out scores (positions-<N>.json) left out or partial:"))
        blocks.extend(Paragraph(f"- {n}") for n in runset.heldout_notes)
    return blocks


def build_report(paths: list[Path], out: Path, opts: ReportOptions = ReportOptions(), required: tuple[str, ...] = ()) -> ReportFiles:
    """Load every run under ``paths`` and write ``report.md``, ``report.html`` and PNG figures to ``out``.

    :param paths: run folders or their parents (searched recursively for ``results.json``)
    :param out: output folder (created)
    :param opts: comparison options
    :param required: method names that must be present (those the user named explicitly)
    :raises ReportError: no runs, unreadable or incompatible runs, or an unknown method
    """
    runset = load_runs(paths)
    methods = sorted({k.method for k in runset.groups})
    for name in required:
        if name not in methods:
            raise ReportError(f"unknown method {name!r}; valid choices (methods found): {', '.join(methods)}")
    out.mkdir(parents=True, exist_ok=True)
    md, html = out / "report.md", out / "report.html"
    before = report_figures(md.read_text()) if md.is_file() else set()
    blocks = report_blocks(runset, opts, out)
    md.write_text(to_markdown(blocks))
    html.write_text(to_html(blocks, "rl_moe report"))
    figures = tuple(out / b.path for b in blocks if isinstance(b, Image))
    # A figure the last report drew and this one does not (a group renamed or gone) would sit
    # beside the new ones as if current; only files the old report.md named are removed.
    for name in before - {f.name for f in figures}:
        (out / name).unlink(missing_ok=True)
    return ReportFiles(md, html, figures)


def report_figures(markdown: str) -> set[str]:
    """The figure files a ``report.md`` shows (plain names in its folder, nothing outside it)."""
    return {name for name in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", markdown) if "/" not in name and name.endswith(".png")}
