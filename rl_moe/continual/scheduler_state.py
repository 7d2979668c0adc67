"""What the continual scheduler holds while it runs, declared once for the mixins that share it
(:mod:`~rl_moe.continual.scheduler_envs`, :mod:`~rl_moe.continual.scheduler_eval`,
:mod:`~rl_moe.continual.scheduler_files`); :class:`~rl_moe.continual.scheduler.ContinualScheduler`
sets every field in its ``__init__``."""

from __future__ import annotations

from typing import Any

from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.vec_env import VecEnv

from rl_moe.continual.config import RunConfig
from rl_moe.continual.evaluation import EvalEnvs
from rl_moe.continual.results import Results
from rl_moe.continual.run_view import RunView
from rl_moe.envs.backend_choice import BackendChoice
from rl_moe.envs.suite_spec import Suite, TaskSpec
from rl_moe.envs.threads import ThreadPlan
from rl_moe.rundir import RunDir


class SchedulerState:
    """The run's configuration and files, the current task's learner, envs and logger, and the
    state kept between tasks."""

    cfg: RunConfig
    suite: Suite
    view: RunView
    tasks: tuple[TaskSpec, ...]
    results: Results
    files: RunDir
    threads: ThreadPlan
    algo_cfg: Any
    progress: bool
    model: BaseAlgorithm | None
    env: VecEnv | None
    logger: Logger | None
    _eval_envs: dict[tuple[int, bool | None], EvalEnvs]
    _backend: BackendChoice
    _boundary_state: dict[str, Any] | None
