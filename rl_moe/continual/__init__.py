"""Continual-task scheduling: suites, env factories and wrappers, CRL/RL protocols,
evaluation and Continual World metrics. The CLI is :mod:`rl_moe.crl`."""

from rl_moe.continual.config import RunConfig
from rl_moe.continual.errors import MissingDependencyError, UsageError
from rl_moe.continual.methods import METHODS, Method
from rl_moe.continual.metrics import CLMetrics, compute_cl_metrics
from rl_moe.continual.results import Results
from rl_moe.continual.suites import Suite, TaskSpec, builtin_suites, load_suite

__all__ = [
    "METHODS",
    "CLMetrics",
    "Method",
    "MissingDependencyError",
    "Results",
    "RunConfig",
    "Suite",
    "TaskSpec",
    "UsageError",
    "builtin_suites",
    "compute_cl_metrics",
    "load_suite",
]
