"""Loading a finished task's checkpoint together with the env it was trained and scored on.

A checkpoint alone is not enough to reproduce a score: the suite's env differs from the package
defaults (``Meta-World/MT1`` gives 500-step episodes over 50 fixed goals, where ``cw10`` plays
500-step goal-observable episodes with each env keeping the position it drew from its seed, and
``cw10-cw`` 200-step ones with a fresh goal at every reset), and HumanoidBench runs normalise
observations with statistics stored beside the checkpoint.

    from rl_moe.continual.checkpoints import load_checkpoint, make_task_env

    model = load_checkpoint("runs/cw10/ppo-sphere-crl-s0-...", "push-wall-v3")
    env = make_task_env("runs/cw10/ppo-sphere-crl-s0-...", "push-wall-v3")
    obs, _ = env.reset()
    action, _ = model.predict(obs, deterministic=True)
"""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.vec_env import DummyVecEnv

from rl_moe.continual.agents import build_model
from rl_moe.continual.config import RunConfig
from rl_moe.continual.resolve import suite_of
from rl_moe.envs.factories import EnvFactory
from rl_moe.envs.suite_spec import TaskSpec
from rl_moe.errors import UsageError
from rl_moe.rundir import RunDir


def _config(run_dir: str | Path) -> RunConfig:
    path = RunDir(run_dir).config
    if not path.is_file():
        raise UsageError(f"{str(run_dir)!r} is not a run folder (no {path.name})")
    return RunConfig.from_dict(json.loads(path.read_text()))


def _task(cfg: RunConfig, task: str | int) -> tuple[int, TaskSpec]:
    """(index, spec) of ``task``, a name or an index into the run's task list (the first
    occurrence of a name that CW20 repeats)."""
    specs = [t for t in suite_of(cfg).tasks if t.name in cfg.tasks]
    by_name = {t.name: t for t in specs}
    if isinstance(task, int):
        if not 0 <= task < len(cfg.tasks):
            raise UsageError(f"task index {task} is out of range; valid choices: 0..{len(cfg.tasks) - 1}")
        return task, by_name[cfg.tasks[task]]
    if task not in by_name:
        raise UsageError(f"unknown task {task!r} in this run; valid choices: {', '.join(cfg.tasks)}")
    return list(cfg.tasks).index(task), by_name[task]


def make_task_env(run_dir: str | Path, task: str | int, seed: int = 0) -> gym.Env:
    """One env of ``task`` exactly as the run built it (episode length, success flag in
    ``info["is_success"]``, family-specific wrappers), seeded with ``seed``.

    HumanoidBench runs normalise observations: their policies expect the env wrapped in the
    ``VecNormalize`` statistics stored beside the checkpoint (``RunDir.vecnormalize(checkpoint)``).
    """
    cfg = _config(run_dir)
    suite = suite_of(cfg)
    _, spec = _task(cfg, task)
    return EnvFactory(suite.family, spec, suite.episode_length, suite.success_type, seed, suite.family_module)()


def load_checkpoint(run_dir: str | Path, task: str | int, device: str = "cpu") -> BaseAlgorithm:
    """The learner as saved at the end of ``task`` (a name or index), with the run's networks
    (MoE kind, regularizers' parametrizations) rebuilt from ``config.json``."""

    cfg = _config(run_dir)
    index, spec = _task(cfg, task)
    path = RunDir(run_dir).checkpoint(index, spec.name)
    if not path.is_file():
        raise UsageError(f"no checkpoint for task {index} ({spec.name}) in {str(run_dir)!r}: the task has not finished")
    env = DummyVecEnv([lambda: make_task_env(run_dir, index)])
    model = build_model(cfg, env, device)
    model.set_parameters(str(path), exact_match=True, device=device)
    return model
