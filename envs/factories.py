"""Env factories per suite family and vectorized-env construction.

A factory is a picklable :class:`EnvFactory` (so ``SubprocVecEnv`` can ship it to workers under
spawn/forkserver); it builds the raw env through its family's spec
(:data:`rl_moe.envs.families.FAMILIES`), then adds the time limit, the success wrapper and
SB3's ``Monitor``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import TimeLimit
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv

from rl_moe.envs import envpool_env
from rl_moe.envs.families import FAMILIES, get_family
from rl_moe.envs.suite_spec import Suite, TaskSpec
from rl_moe.envs.wrappers import InfoSuccess, ReturnSuccess
from rl_moe.errors import UsageError

#: ``--vec-env`` choices; ``auto`` measures per task between the official envs and EnvPool where
#: the family has a pool and it is installed (:mod:`rl_moe.envs.backend_choice`), else picks by
#: core count.
VEC_ENV_TYPES: tuple[str, ...] = ("auto", "dummy", "subproc", "envpool")


@dataclass(frozen=True)
class EnvFactory:
    """Builds one wrapped env of a suite task.

    :param family: suite family (key of :data:`~rl_moe.envs.families.FAMILIES`)
    :param task: the task
    :param episode_length: time limit in steps
    :param success_type: ``info`` or ``return`` (see :mod:`rl_moe.envs.wrappers`)
    :param seed: env seed (MetaWorld takes it at construction; it ignores ``reset(seed=)``)
    :param family_module: the module that registers ``family`` when it is not a built-in one
        (imported where the factory is called: a worker process starts without it)
    """

    family: str
    task: TaskSpec
    episode_length: int
    success_type: str
    seed: int
    family_module: str = ""

    def __call__(self) -> gym.Env:
        env = get_family(self.family, self.family_module).make(self.task, self.seed)
        env = TimeLimit(env, max_episode_steps=self.episode_length)
        if self.success_type == "info":
            env = InfoSuccess(env)
        else:
            env = ReturnSuccess(env, float(self.task.success_bar if self.task.success_bar is not None else 0.0))
        return Monitor(env, info_keywords=("is_success",))

    def reseed(self, env: gym.Env) -> None:
        """Return an env this factory built to the random state it was built with (evaluation
        envs are built once per task and reused: fresh MetaWorld envs cost ~50 MB of memory per
        task that was never returned)."""
        get_family(self.family, self.family_module).reseed(env, self.seed)


def task_factories(suite: Suite, task: TaskSpec, n_envs: int, seed: int) -> list[EnvFactory]:
    """One factory per sub-env, seeds ``seed, seed+1, ...``."""
    return [EnvFactory(suite.family, task, suite.episode_length, suite.success_type, seed + i, suite.family_module) for i in range(n_envs)]


_FELL_BACK: set[str] = set()


def _fallback_note(task: str, why: str) -> str:
    return f"note: {task} runs on the official in-process envs, not EnvPool: {why}\n"


def _note_fallback(task: str, why: str) -> None:
    note = _fallback_note(task, why)
    if note not in _FELL_BACK:
        _FELL_BACK.add(note)
        sys.stderr.write(note)


def announce_fallbacks(suite: Suite, tasks: list[TaskSpec]) -> None:
    """One note at a run's start naming every task the native pool leaves to the official envs,
    with the reasons; the per-task notes of :func:`make_vec_env` then stay silent for them."""
    refusal = FAMILIES[suite.family].pool_refusal
    if refusal is None:
        return
    reasons: dict[str, list[str]] = {}
    for task in tasks:
        why = refusal(task)
        if why is not None:
            _FELL_BACK.add(_fallback_note(task.name, why))
            reasons.setdefault(why, []).append(task.name)
    if len(reasons) == 1 and len(next(iter(reasons.values()))) == len(tasks):  # one reason for the whole run
        sys.stderr.write(f"note: EnvPool is not used for this run: {next(iter(reasons))}; every task runs on the official envs\n")
    elif reasons:
        n = sum(len(v) for v in reasons.values())
        parts = "; ".join(f"{', '.join(names)}: {why}" for why, names in reasons.items())
        sys.stderr.write(f"note: {n} of {len(tasks)} tasks run on the official envs, not EnvPool ({parts})\n")


def may_pool(vec_type: str) -> bool:
    """Whether a run on the resolved ``vec_type`` may step tasks on a native pool (``envpool``,
    or ``auto`` choosing per task): it then gets pool workers, and evaluates on the pool."""
    return vec_type in ("envpool", "auto")


def resolve_vec_env_type(vec_env: str, n_envs: int, cpu_count: int | None = None, family: str | None = None) -> str:
    """``dummy``, ``subproc``, ``envpool`` or ``auto`` for a run of the suite family ``family``.

    ``auto`` stays ``auto`` for a family with a native pool when the package is installed: each
    task then trains on whichever of the official envs and the pool steps fastest when it starts
    (:mod:`rl_moe.envs.backend_choice`; EnvPool wins on an idle machine, and the measurement guards
    a busy one). Otherwise it picks in-process envs on <= 2 cores: on 2 cores a DummyVecEnv
    of 8 MetaWorld envs ran ~2,000 steps/s against ~1,270 for SubprocVecEnv (measured on the 2-core
    development machine), so worker processes only pay off with more cores.
    """

    if vec_env not in VEC_ENV_TYPES:
        raise UsageError(f"unknown vec env type {vec_env!r}; valid choices: {', '.join(VEC_ENV_TYPES)}")
    native = family is not None and FAMILIES[family].pool is not None
    if vec_env == "envpool":
        if family is not None and not native:
            with_pool = ", ".join(k for k, f in FAMILIES.items() if f.pool is not None)
            raise UsageError(f"--vec-env envpool has no {family!r} envs; it serves suites of: {with_pool}")
        envpool_env.check_envpool()  # looked up at call time: whether envpool is installed is a runtime fact
        return vec_env
    if vec_env != "auto":
        return vec_env
    if native and envpool_env.envpool_installed():
        return "auto"
    cores = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
    return "dummy" if cores <= 2 or n_envs == 1 else "subproc"


class InProcessVecEnv(DummyVecEnv):
    """SB3's ``DummyVecEnv`` with one change: ``step_wait`` hands out a shallow copy of each info
    dict instead of a ``deepcopy`` of the list (7% of a MetaWorld step on the fast path). Every
    step puts fresh dicts from the envs into the buffer, so the copies cannot alias a later step."""

    def step_wait(self) -> Any:
        for i in range(self.num_envs):  # DummyVecEnv.step_wait's loop, unchanged
            obs, self.buf_rews[i], terminated, truncated, self.buf_infos[i] = self.envs[i].step(self.actions[i])
            self.buf_dones[i] = terminated or truncated
            self.buf_infos[i]["TimeLimit.truncated"] = truncated and not terminated
            if self.buf_dones[i]:
                self.buf_infos[i]["terminal_observation"] = obs
                obs, self.reset_infos[i] = self.envs[i].reset()
            self._save_obs(i, obs)
        return self._obs_from_buf(), np.copy(self.buf_rews), np.copy(self.buf_dones), [dict(info) for info in self.buf_infos]


def make_vec_env(factories: list[EnvFactory], vec_type: str, pool_threads: int = 1) -> VecEnv:
    """The vectorized env of ``factories`` (``vec_type`` already resolved): a DummyVecEnv, a
    SubprocVecEnv, or the family's native pool with the factories' task, seeds and episode length
    on ``pool_threads`` worker threads (the run's :class:`~rl_moe.envs.threads.ThreadPlan`).

    A task the native pool does not serve faithfully runs on in-process envs (said once per task).
    """
    if vec_type == "envpool":
        first = factories[0]
        pool = FAMILIES[first.family].pool
        if pool is None:
            raise UsageError(f"--vec-env envpool has no {first.family!r} envs")
        env = pool(first.task, [f.seed for f in factories], first.episode_length, max(1, pool_threads))
        if not isinstance(env, str):
            return env
        _note_fallback(first.task.name, env)
        vec_type = "dummy"
    if vec_type == "subproc" and len(factories) > 1:
        return SubprocVecEnv(list(factories))
    return InProcessVecEnv(list(factories))
