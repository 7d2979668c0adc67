"""Env factories per suite family and vectorized-env construction.

A factory is a picklable :class:`EnvFactory` (so ``SubprocVecEnv`` can ship it to workers under
spawn/forkserver); it builds the raw env through the family registry :data:`FAMILY_MAKERS`, then
adds the time limit, the success wrapper and SB3's ``Monitor``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
from gymnasium.wrappers import TimeLimit
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv

from rl_moe.continual.errors import MissingDependencyError, UsageError
from rl_moe.continual.suites import Suite, TaskSpec
from rl_moe.continual.wrappers import InfoSuccess, PermuteObsFlipAction, ReturnSuccess

#: ``--vec-env`` choices; ``auto`` picks by core count.
VEC_ENV_TYPES: tuple[str, ...] = ("auto", "dummy", "subproc")


def _make_metaworld(task: TaskSpec, seed: int) -> gym.Env:
    import metaworld  # noqa: F401  (registers the Meta-World/* ids)

    # MT1 pre-samples 50 goals and ignores reset(seed=); goal_observable with an unfrozen,
    # seeded rand vec draws a fresh goal at every reset, as Continual World does.
    env = gym.make("Meta-World/goal_observable", env_name=task.name, seed=seed, disable_env_checker=True)
    env.unwrapped._freeze_rand_vec = False  # type: ignore[attr-defined]
    env.unwrapped.seeded_rand_vec = True  # type: ignore[attr-defined]
    return env


def _make_humanoidbench(task: TaskSpec, seed: int) -> gym.Env:
    from rl_moe.continual.humanoidbench import make_h1

    env = make_h1(task.name)
    env.reset(seed=seed)
    return env


def _make_smoke(task: TaskSpec, seed: int) -> gym.Env:
    env = gym.make(str(task.params.get("env_id", "Pendulum-v1")), disable_env_checker=True)
    env = PermuteObsFlipAction(env, task.params.get("permutation", (0, 1, 2)), float(task.params.get("action_sign", 1.0)))
    env.reset(seed=seed)
    env.action_space.seed(seed)
    return env


#: family -> raw env maker ``(task, seed) -> gym.Env``.
FAMILY_MAKERS: dict[str, Callable[[TaskSpec, int], gym.Env]] = {
    "metaworld": _make_metaworld,
    "humanoidbench": _make_humanoidbench,
    "smoke": _make_smoke,
}


def _reseed_metaworld(env: gym.Env, seed: int) -> None:
    env.unwrapped.seed(seed)  # type: ignore[attr-defined]  (reset(seed=) is ignored)


def _reseed_by_reset(env: gym.Env, seed: int) -> None:
    env.reset(seed=seed)
    env.action_space.seed(seed)


#: family -> ``(env, seed) -> None``: puts a built env back into the state its factory left it
#: in, so evaluation envs are built once per task and reused (fresh MetaWorld envs cost ~50 MB
#: of memory per task that was never returned).
FAMILY_RESEED: dict[str, Callable[[gym.Env, int], None]] = {
    "metaworld": _reseed_metaworld,
    "humanoidbench": _reseed_by_reset,
    "smoke": _reseed_by_reset,
}


@dataclass(frozen=True)
class EnvFactory:
    """Builds one wrapped env of a suite task.

    :param family: suite family (key of :data:`FAMILY_MAKERS`)
    :param task: the task
    :param episode_length: time limit in steps
    :param success_type: ``info`` or ``return`` (see :mod:`rl_moe.continual.wrappers`)
    :param seed: env seed (MetaWorld takes it at construction; it ignores ``reset(seed=)``)
    """

    family: str
    task: TaskSpec
    episode_length: int
    success_type: str
    seed: int

    def __call__(self) -> gym.Env:
        env = FAMILY_MAKERS[self.family](self.task, self.seed)
        env = TimeLimit(env, max_episode_steps=self.episode_length)
        if self.success_type == "info":
            env = InfoSuccess(env)
        else:
            env = ReturnSuccess(env, float(self.task.success_bar if self.task.success_bar is not None else 0.0))
        return Monitor(env, info_keywords=("is_success",))

    def reseed(self, env: gym.Env) -> None:
        """Return an env this factory built to the random state it was built with."""
        FAMILY_RESEED[self.family](env, self.seed)


def task_factories(suite: Suite, task: TaskSpec, n_envs: int, seed: int) -> list[EnvFactory]:
    """One factory per sub-env, seeds ``seed, seed+1, ...``."""
    return [EnvFactory(suite.family, task, suite.episode_length, suite.success_type, seed + i) for i in range(n_envs)]


def resolve_vec_env_type(vec_env: str, n_envs: int, cpu_count: int | None = None) -> str:
    """``dummy`` or ``subproc``: ``auto`` picks in-process envs on <= 2 cores.

    On 2 cores a DummyVecEnv of 8 MetaWorld envs ran ~2,000 steps/s against ~1,270 for
    SubprocVecEnv (measured on the 2-core development machine), so worker processes only pay off with more cores.
    """
    if vec_env not in VEC_ENV_TYPES:
        raise UsageError(f"unknown vec env type {vec_env!r}; valid choices: {', '.join(VEC_ENV_TYPES)}")
    if vec_env != "auto":
        return vec_env
    cores = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
    return "dummy" if cores <= 2 or n_envs == 1 else "subproc"


def make_vec_env(factories: list[EnvFactory], vec_type: str) -> VecEnv:
    """A DummyVecEnv or SubprocVecEnv over ``factories`` (``vec_type`` already resolved)."""
    if vec_type == "subproc" and len(factories) > 1:
        return SubprocVecEnv(list(factories))
    return DummyVecEnv(list(factories))


def _metaworld_names() -> tuple[str, ...]:
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE

    return tuple(sorted(k.replace("-goal-observable", "") for k in ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE))


def check_tasks(suite: Suite) -> None:
    """Raise :class:`UsageError` for a task its family cannot build (checked before any run folder)."""
    tasks = (*suite.tasks, suite.probe_task)
    if suite.family == "metaworld":
        valid = _metaworld_names()
        for t in tasks:
            if t.name not in valid:
                raise UsageError(f"unknown MetaWorld task {t.name!r} in suite {suite.name!r}; valid choices: {', '.join(valid)}")
    elif suite.family == "smoke":
        for t in tasks:
            env_id = str(t.params.get("env_id", "Pendulum-v1"))
            if env_id not in gym.registry:
                raise UsageError(f"unknown gymnasium env id {env_id!r} for task {t.name!r}; e.g. Pendulum-v1")
            try:
                _make_smoke(t, 0).close()
            except ValueError as exc:
                raise UsageError(f"bad smoke task {t.name!r}: {exc}") from None


def check_family_available(family: str) -> None:
    """Raise :class:`MissingDependencyError` when the family's package is missing (before any run folder exists)."""
    import importlib.util

    if family == "metaworld" and importlib.util.find_spec("metaworld") is None:
        raise MissingDependencyError("MetaWorld is not installed; install it with: pip install 'metaworld==3.1.1' packaging")
    if family == "humanoidbench":
        from rl_moe.continual.humanoidbench import check_available

        check_available()
