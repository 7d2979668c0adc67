"""Reports over run folders: per-task success tables (SPHERE paper Tables 13-17), RL vs CRL gaps,
robust aggregates (IQM, probability of improvement), how far methods are from separating,
Continual World metrics, plasticity diagnostics against the baseline, and plasticity plots.

``python -m rl_moe.report runs/cw10 --out report`` writes ``report.md`` and ``report.html`` with PNG
figures beside them. Runs are grouped under today's name of the rules they recorded: ``cw10-paper``
runs as ``cw10``, and ``cw10`` runs from before 2026-11-26 (200-step episodes, or no recorded
rules) as ``cw10-cw``.
"""

from rl_moe.report.build import ReportFiles, ReportOptions, build_report
from rl_moe.report.loading import RunSet, load_runs
from rl_moe.report.runs import ReportError, Run, RunKey

__all__ = ["ReportError", "ReportFiles", "ReportOptions", "Run", "RunKey", "RunSet", "build_report", "load_runs"]
