"""Is a MetaWorld env backend equivalent to the official envs? Statistics of the scripted experts.

The two backends cannot share a random stream, so they are compared through statistics: success
rate, episode return and per-dimension observation mean and std along the trajectories of
MetaWorld's scripted policies, under our protocol (200-step episodes, goal resampled at every
reset, success at any step). ``tests/test_envpool.py`` compares EnvPool against the official
numbers stored in ``tests/data/cw10_expert_stats.json``; a slow test checks that file against the
official envs, and this module rewrites it:

    python -m rl_moe.envs.backend_check --out tests/data/cw10_expert_stats.json
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from stable_baselines3.common.vec_env import VecEnv

from rl_moe.envs.envpool_env import EnvPoolMetaWorld, official_observation_space
from rl_moe.envs.factories import make_vec_env, task_factories
from rl_moe.envs.families import metaworld_expert
from rl_moe.envs.suite_spec import Suite, TaskSpec
from rl_moe.envs.suites import load_suite

#: Episodes per task, sub-envs and the seed of the first sub-env (the others follow it).
N_EPISODES, N_ENVS, SEED = 50, 10, 1000


def backend_env(suite: Suite, task: TaskSpec, backend: str, n_envs: int, seed: int) -> VecEnv:
    """``n_envs`` envs of ``task`` on ``official`` (DummyVecEnv of the run's factories) or
    ``envpool`` (the adapter itself, also for tasks a run keeps on the official envs)."""

    factories = task_factories(suite, task, n_envs, seed)
    if backend == "envpool":
        return EnvPoolMetaWorld(task.name, [f.seed for f in factories], suite.episode_length, 1, official_observation_space())
    return make_vec_env(factories, "dummy")


def expert_statistics(suite: Suite, task: TaskSpec, backend: str, n_episodes: int = N_EPISODES, n_envs: int = N_ENVS, seed: int = SEED) -> dict[str, Any]:
    """Success rate, return mean/std and observation mean/std of ``n_episodes`` scripted-expert
    episodes (the first ones to finish, ``n_episodes / n_envs`` per env)."""

    policy = metaworld_expert(task.name)
    env = backend_env(suite, task, backend, n_envs, seed)
    success: list[float] = []
    returns: list[float] = []
    states: list[np.ndarray] = []
    try:
        obs = env.reset()
        with warnings.catch_warnings():  # the experts warn that the env clips their actions
            warnings.simplefilter("ignore", UserWarning)
            while len(success) < n_episodes:
                states.append(np.asarray(obs))
                actions = np.clip(np.stack([policy.get_action(o) for o in obs]), -1.0, 1.0).astype(np.float32)
                obs, _, dones, infos = env.step(actions)
                for i in np.flatnonzero(dones):
                    success.append(float(infos[i]["is_success"]))
                    returns.append(float(infos[i]["episode"]["r"]))
    finally:
        env.close()
    x = np.concatenate(states)
    return {
        "n_episodes": n_episodes,
        "success": float(np.mean(success[:n_episodes])),
        "return_mean": float(np.mean(returns[:n_episodes])),
        "return_std": float(np.std(returns[:n_episodes])),
        "obs_mean": x.mean(0).tolist(),
        "obs_std": x.std(0).tolist(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Write the official envs' scripted-expert statistics of a suite")
    p.add_argument("--suite", default="cw10-cw")
    p.add_argument("--backend", default="official", choices=["official", "envpool"])
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    suite = load_suite(args.suite)
    stats = {t.name: expert_statistics(suite, t, args.backend) for t in suite.tasks}
    meta = {"suite": suite.name, "backend": args.backend, "n_envs": N_ENVS, "seed": SEED, "episode_length": suite.episode_length}
    Path(args.out).write_text(json.dumps({"meta": meta, "tasks": stats}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
