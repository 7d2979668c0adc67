"""What a run folder holds for the tools that read it without training: its tasks, the fixed-seed
eval envs every checkpoint is scored on, its checkpoints and their saved observation statistics.

The scheduler scores its checkpoints through the same view, so ``python -m rl_moe.evaluate``,
``python -m rl_moe.positions`` and ``tools/`` evaluate exactly as the run did.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

from stable_baselines3.common.vec_env import VecNormalize

from rl_moe.continual import rng
from rl_moe.continual.config import RunConfig
from rl_moe.envs.backend_choice import pool_serves
from rl_moe.envs.factories import EnvFactory, may_pool, task_factories
from rl_moe.envs.suite_spec import TaskSpec
from rl_moe.rundir import RunDir


@dataclass(frozen=True)
class RunView:
    """A run folder read through its config (``config.json``).

    :param cfg: the run's configuration
    :param run_dir: the run folder
    """

    cfg: RunConfig
    run_dir: Path

    @property
    def tasks(self) -> list[TaskSpec]:
        """The run's tasks, in order (a prefix of its suite's)."""
        return list(self.cfg.suite_spec.tasks[: len(self.cfg.tasks)])

    @property
    def uses_pool(self) -> bool:
        """Whether the run steps or evaluates any task on the native pool: always under
        ``envpool``, and under ``auto`` where the pool serves one of its tasks."""
        if self.cfg.vec_env == "auto":
            return any(pool_serves(t, self.cfg.suite_spec.family) for t in self.tasks)
        return may_pool(self.cfg.vec_env)

    def eval_factories(self, j: int, heldout: bool | None = None, n_envs: int | None = None) -> list[EnvFactory]:
        """Fixed-seed eval envs of task ``j``: every checkpoint is scored on the same goals.

        :param heldout: seeds of their own (True) or the first training envs' (False); None: the
            run's main view (``eval.positions``: held-out unless ``train`` or ``both``)
        :param n_envs: envs (default ``eval.n_envs``); more held-out envs extend the run's own:
            seeds run on from the same first one, so the first ``eval.n_envs`` are the run's
        """
        if heldout is None:
            heldout = self.cfg.eval.positions == "heldout"
        stream = "eval" if heldout else "train"
        seed = rng.env_seed(self.cfg.seed, stream, j)
        return task_factories(self.cfg.suite_spec, self.tasks[j], n_envs or self.cfg.eval.n_envs, seed)

    def checkpoint(self, i: int) -> Path:
        """Finished task ``i``'s checkpoint."""
        return RunDir(self.run_dir).checkpoint(i, self.tasks[i].name)

    def load_vecnormalize(self, i: int) -> VecNormalize | None:
        """The observation statistics saved with finished task ``i``'s checkpoint (None: none)."""
        path = RunDir.vecnormalize(self.checkpoint(i))
        if not path.is_file():
            return None
        with open(path, "rb") as fh:
            return pickle.load(fh)
