"""Reports over run folders: per-task success tables (SPHERE paper Tables 13-17), RL vs CRL gaps,
robust aggregates (IQM, probability of improvement), Continual World metrics and plasticity plots.

``python -m rl_moe.report runs/cw10 --out report`` writes ``report.md`` and ``report.html`` with PNG
figures beside them.
"""

from rl_moe.report.build import ReportFiles, ReportOptions, build_report
from rl_moe.report.loading import ReportError, Run, RunKey, RunSet, load_runs

__all__ = ["ReportError", "ReportFiles", "ReportOptions", "Run", "RunKey", "RunSet", "build_report", "load_runs"]
