"""Running an agent through a task sequence: the scheduler, the CRL/RL protocols, evaluation,
resume and checkpoints, results and Continual World metrics, methods, learners and run config.
The CLI is :mod:`rl_moe.crl`.

What builds and steps environments (env families, suite files and their types, env factories,
vector backends, wrappers, thread choice) belongs in ``rl_moe.envs`` (the top-level ``envs/``
folder), which never imports this package.
"""

from rl_moe.continual.config import RunConfig
from rl_moe.continual.methods import METHODS, Method
from rl_moe.continual.metrics import CLMetrics, compute_cl_metrics
from rl_moe.continual.results import Results
from rl_moe.envs.suites import Suite, TaskSpec, builtin_suites, load_suite
from rl_moe.errors import MissingDependencyError, UsageError

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
