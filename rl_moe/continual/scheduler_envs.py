"""The continual scheduler's training envs: each task's backend (``--vec-env``, measured per task
under ``auto``), its vectorized envs and their observation statistics (a mixin of
:class:`~rl_moe.continual.scheduler.ContinualScheduler`)."""

from __future__ import annotations

import copy
import sys
from typing import Any

from stable_baselines3.common.vec_env import VecEnv, VecNormalize

from rl_moe.continual import rng
from rl_moe.continual.evaluation import release_memory
from rl_moe.continual.scheduler_state import SchedulerState
from rl_moe.envs.backend_choice import OFFICIAL, BackendChoice, Candidate, choose_backend, recorded_backend
from rl_moe.envs.factories import EnvFactory, make_vec_env, task_factories


class TaskEnvs(SchedulerState):
    """Builds and closes the training envs of each task."""

    def _seed(self, stream: str, task_index: int) -> int:
        return rng.env_seed(self.cfg.seed, stream, task_index)

    def _fixed_backend(self) -> BackendChoice:
        """The run's backend (under ``auto``, the official envs until a task chooses)."""
        vec_type = self.cfg.vec_env
        if vec_type == "auto":
            return BackendChoice(OFFICIAL)
        return BackendChoice(Candidate(vec_type, self.threads.pool_threads if vec_type == "envpool" else 0))

    def _choose_backend(self, i: int, factories: list[EnvFactory], measure: bool) -> BackendChoice:
        """Task ``i``'s training backend: the run's, or under ``--vec-env auto`` the one the task
        already ran on (a rerun) or else, with ``measure``, the fastest here and now
        (:mod:`rl_moe.envs.backend_choice`)."""
        if self.cfg.vec_env != "auto":
            return self._fixed_backend()
        recorded = recorded_backend(self.results.provenance, i, self.threads.pool_threads)
        if recorded is not None or not measure:
            return recorded or BackendChoice(OFFICIAL)
        choice = choose_backend(factories, self.threads.pool_threads)
        release_memory()  # the measured envs are closed: hand their heap back (see release_memory)
        note = choice.note(self.tasks[i].name)
        if note is not None:
            print(note, file=sys.stderr)
        return choice

    def _make_env(self, i: int, previous: VecEnv | None, measure: bool = True) -> VecEnv:
        factories = task_factories(self.suite, self.tasks[i], self.algo_cfg.n_envs, self._seed("train", i))
        self._backend = self._choose_backend(i, factories, measure)
        env: VecEnv = make_vec_env(factories, self._backend.chosen.vec_type, self._backend.chosen.workers)
        if self.algo_cfg.normalize_obs:
            env = VecNormalize(env, norm_obs=True, norm_reward=self.algo_cfg.normalize_reward, gamma=self.algo_cfg.gamma)
            # CRL: input statistics belong to the agent and carry over; RL starts afresh.
            if self.cfg.protocol == "crl" and isinstance(previous, VecNormalize):
                env.obs_rms, env.ret_rms = copy.deepcopy(previous.obs_rms), copy.deepcopy(previous.ret_rms)
        return env

    def _close_env(self) -> None:
        if self.env is not None:
            try:
                self.env.close()
            except (EOFError, BrokenPipeError, ConnectionResetError):
                pass  # subprocess workers already gone (Ctrl-C reaches them too)
            self.env = None

    def _backend_record(self) -> dict[str, Any]:
        """Under ``--vec-env auto``, the pool's workers and the measured rates (none on a rerun)."""
        return self._backend.record() if self.cfg.vec_env == "auto" else {}
